"""The common.ai adapter acts only on batch ids this deployment issued.

common.ai reads a batch id back from ``<result_path>/_airflow_batch_state/<key>.json``, whose key is a
hash of dag, task, run and map index with no secret in it: dev and prod running one DAG against a
shared result store read each other's file, and anyone who can write it can put any id there. So
every adapter call on a batch id (``get_batch``, ``cancel_batch``, ``iter_results``) first proves the
id this deployment's, as ``find_orphaned_batch`` does: its HMAC (shared/job_ids.py) under this
deployment's key. Any other id reads as not found (Ray's 404, which common.ai answers by submitting
a batch of its own), and is never stopped nor read. Fast tests on a fake cluster; the real one runs
this deployment's own ids in tests/integration/test_common_ai.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("airflow.providers.common.ai", reason="needs the common-ai extra")

from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator  # noqa: E402
from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from airflow_provider_raybatch.common_ai import adapter as adapter_module  # noqa: E402
from airflow_provider_raybatch.common_ai.adapter import (  # noqa: E402
    COUNT_META,
    OUTPUT_META,
    RayBatchAdapter,
)
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus  # noqa: E402
from airflow_provider_raybatch.jobs.deployment_secret import signing_key  # noqa: E402
from airflow_provider_raybatch.shared.exceptions import RayJobNotFoundError  # noqa: E402
from airflow_provider_raybatch.shared.job_ids import TaskTry  # noqa: E402
from tests.unit.common_ai.test_adapter import HOST, TOKEN, FakeRay, _commit, _ok  # noqa: E402

PROD_SECRET = "prod-deployment-secret"
DEV_SECRET = "dev-deployment-secret"
RUN_AFTER = datetime(2026, 12, 1, tzinfo=UTC)
#: The task instance both deployments run: the same DAG, task, run id and map index.
TRY = TaskTry("reviews", "manual__1", "classify", -1, 1, RUN_AFTER.isoformat())
#: The raybatch settings of the tests' common.ai tasks: the tiny model, no layout check.
SETTINGS = {"raybatch": {"check_layout": False, "engine_kwargs": {"max_model_len": 512}}}


def common_ai_operator(result_path: str, prompts: list[str]) -> LLMBatchOperator:
    """common.ai's deferrable ``LLMBatchOperator`` of :data:`TRY`'s task on the ``raybatch:tiny`` model."""
    return LLMBatchOperator(
        task_id=TRY.task_id,
        requests=prompts,
        result_path=result_path,
        llm_conn_id="ray_llm",
        model_id="raybatch:tiny",
        deferrable=True,
        do_xcom_push=False,
        request_params=SETTINGS,
    )


OURS = TRY.submission_id(signing_key(PROD_SECRET))
#: Ids of jobs on the cluster that are not this deployment's, each carrying a copy of our metadata.
FOREIGN = {
    "another deployment's job of the same task instance": TRY.submission_id(signing_key(DEV_SECRET)),
    "our id's shape with a forged HMAC": OURS[:-16] + ("0" * 16 if not OURS.endswith("0" * 16) else "1" * 16),
    "an id made up for another try": replace(TRY, try_number=2).submission_id(b"guessed key"),
}
#: Ids that are no submission id at all: the cluster is never asked about them.
MALFORMED = {
    "not ours in shape": "job-1",
    "empty": "",
    "a NUL byte": OURS + "\x00",
    "a NUL byte inside": OURS[:12] + "\x00" + OURS[12:],
    "a path": "../" + OURS,
    "a path after": OURS + "/stop",
    "overlong": "raybatch-" + "a" * 10_000 + OURS[-20:],
    "not ASCII": OURS.replace("reviews", "révïews"),
    "a newline": OURS + "\n",
    "upper-case HMAC": OURS[:-16] + OURS[-16:].upper(),
}


@pytest.fixture(autouse=True)
def this_deployment(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """This deployment is prod; returns its signing key."""
    monkeypatch.setenv("AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET", PROD_SECRET)
    return signing_key(PROD_SECRET)


class WatchedRay(FakeRay):
    """The fake cluster, recording every call that names a job."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def get_job_info(self, job_id: str) -> JobInfo:
        self.calls.append(("get_job_info", job_id))
        if job_id not in self.jobs:
            raise RayJobNotFoundError(f"Ray job {job_id} not found", status_code=404)
        return super().get_job_info(job_id)

    def stop_job(self, job_id: str) -> bool:
        self.calls.append(("stop_job", job_id))
        return super().stop_job(job_id)

    def get_job_log_tail(self, job_id: str, lines: int = 40) -> str:
        self.calls.append(("get_job_log_tail", job_id))
        return super().get_job_log_tail(job_id, lines)


@pytest.fixture
def fake() -> WatchedRay:
    return WatchedRay()


@pytest.fixture
def adapter(fake: WatchedRay) -> RayBatchAdapter:
    return RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)


@pytest.fixture
def read_manifests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every output folder whose committed manifest the adapter reads."""
    read: list[str] = []
    real = adapter_module.read_committed_manifest

    def reading(output_uri: str, *args: Any) -> Any:  # Any: as the real function.
        read.append(output_uri)
        return real(output_uri, *args)

    monkeypatch.setattr(adapter_module, "read_committed_manifest", reading)
    return read


def _task_context(monkeypatch: pytest.MonkeyPatch, task_try: TaskTry = TRY, task: Any = None) -> dict:
    """What the adapter sees in a worker, inside the task ``task_try`` (common.ai's operator)."""
    ti = SimpleNamespace(
        dag_id=task_try.dag_id,
        run_id=task_try.run_id,
        task_id=task_try.task_id,
        map_index=task_try.map_index,
        try_number=task_try.try_number,
    )
    ctx = {"ti": ti, "task_instance": ti, "task": task, "dag_run": SimpleNamespace(run_after=RUN_AFTER)}
    monkeypatch.setattr(adapter_module, "_context", lambda: ctx)
    return ctx


def _cluster_job(
    fake: FakeRay, job_id: str, status: JobStatus, output: Path, task_try: TaskTry = TRY
) -> None:
    """A job on the cluster under ``job_id`` with ``task_try``'s metadata (anyone can copy it), whose
    output folder holds a committed result of that job."""
    metadata = {**task_try.metadata(), OUTPUT_META: str(output), COUNT_META: "1"}
    fake.jobs[job_id] = JobInfo(job_id, status, message="m", metadata=metadata, start_time_ms=1)
    _commit(output, job_id, [_ok(0, "someone else's answer")], [])


@pytest.fixture(params=["triggerer", "worker"])
def where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """common.ai polls from its trigger (no task context) and acts from its operator (a context)."""
    if request.param == "worker":
        _task_context(monkeypatch)
    return request.param


def _refused(call: Any) -> RayJobNotFoundError:
    """``call()`` raised the not-found error common.ai takes for "submit a batch of your own"."""
    with pytest.raises(RayJobNotFoundError) as err:
        call()
    assert LLMBatchOperator._is_not_found_error(err.value)
    return err.value


def _refused_by_every_call(adapter: RayBatchAdapter, batch_id: str) -> None:
    """Every adapter call on a batch id: common.ai polls, cancels, and lands the results."""
    for call in (
        adapter.get_batch,
        adapter.cancel_batch,
        lambda batch_id: list(adapter.iter_results(batch_id)),
    ):
        _refused(lambda: call(batch_id))  # noqa: B023 - called at once, inside the loop


# -- foreign ids: not found, never stopped, never read -------------------------------------------


@pytest.mark.parametrize("status", [JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED])
@pytest.mark.parametrize("batch_id", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_foreign_batch_id_reads_as_not_found_and_is_never_stopped_nor_read(
    adapter: RayBatchAdapter,
    fake: WatchedRay,
    tmp_path: Path,
    read_manifests: list,
    where: str,
    batch_id: str,
    status: JobStatus,
) -> None:
    _cluster_job(fake, batch_id, status, tmp_path / "out")
    _refused_by_every_call(adapter, batch_id)
    assert fake.stopped == [] and read_manifests == []
    assert [name for name, _ in fake.calls] == ["get_job_info"] * 3  # no log read, no stop


@pytest.mark.parametrize("batch_id", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_batch_id_never_reaches_the_cluster(
    adapter: RayBatchAdapter,
    fake: WatchedRay,
    tmp_path: Path,
    read_manifests: list,
    where: str,
    batch_id: str,
) -> None:
    _cluster_job(fake, batch_id, JobStatus.RUNNING, tmp_path / "out")
    _refused_by_every_call(adapter, batch_id)
    assert (fake.calls, fake.stopped, read_manifests) == ([], [], [])


def test_in_a_task_another_task_instances_job_of_ours_reads_as_not_found(
    adapter: RayBatchAdapter, fake: WatchedRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state file rewritten to name another of this deployment's jobs: the worker acts only on
    jobs of its own task instance (any try), as the operator does."""
    other = replace(TRY, task_id="summarize")
    batch_id = other.submission_id(signing_key(PROD_SECRET))
    _cluster_job(fake, batch_id, JobStatus.RUNNING, tmp_path / "out", task_try=other)
    _task_context(monkeypatch)
    _refused_by_every_call(adapter, batch_id)
    assert fake.stopped == []


def test_the_warning_names_the_ids_problem_and_no_secret(
    adapter: RayBatchAdapter, fake: WatchedRay, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    foreign = FOREIGN["another deployment's job of the same task instance"]
    _cluster_job(fake, foreign, JobStatus.RUNNING, tmp_path / "out")
    error = _refused(lambda: adapter.cancel_batch(foreign))
    _refused(lambda: adapter.get_batch(MALFORMED["overlong"]))
    text = caplog.text + str(error)
    assert foreign in text and "HMAC" in text and "not stopped" in text
    assert "not a raybatch submission id" in text and "a" * 200 not in text  # truncated
    for secret in (PROD_SECRET, DEV_SECRET, signing_key(PROD_SECRET).hex(), signing_key(DEV_SECRET).hex()):
        assert secret not in text


# -- this deployment's own ids still work ----------------------------------------------------------


@pytest.mark.parametrize("try_number", [1, 2], ids=["its own try", "a retry re-attaching"])
def test_this_deployments_own_batch_id_works_for_every_call(
    adapter: RayBatchAdapter,
    fake: WatchedRay,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    try_number: int,
) -> None:
    if where == "worker":
        _task_context(monkeypatch, replace(TRY, try_number=try_number))
    _cluster_job(fake, OURS, JobStatus.SUCCEEDED, tmp_path / "out")
    assert adapter.get_batch(OURS).status == "completed"
    assert [item.raw for item in adapter.iter_results(OURS)] == ["someone else's answer"]
    fake.jobs[OURS] = replace(fake.jobs[OURS], status=JobStatus.RUNNING)
    assert adapter.get_batch(OURS).status == "in_progress"
    adapter.cancel_batch(OURS)
    assert fake.stopped == [OURS]


# -- any other string is refused -----------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch_id=st.one_of(
        st.text(max_size=300),
        st.from_regex(
            r"raybatch-[A-Za-z0-9_.-]{0,130}-m-?[0-9]{1,4}-t[0-9]{1,3}(-a[0-9]{1,2})?-[0-9a-f]{16}",
            fullmatch=True,
        ),
        st.builds(lambda tail: OURS[:-16] + tail, st.from_regex(r"[0-9a-f]{16}", fullmatch=True)),
    )
)
def test_no_string_but_an_id_this_deployment_issued_passes(tmp_path: Path, batch_id: str) -> None:
    """Even when the cluster says a job exists under any id with our metadata (copied), only the
    id this deployment issued for that metadata is acted on."""
    assume(batch_id != OURS)

    class Anything(WatchedRay):
        def get_job_info(self, job_id: str) -> JobInfo:
            self.calls.append(("get_job_info", job_id))
            metadata = {**TRY.metadata(), OUTPUT_META: str(tmp_path / "out"), COUNT_META: "1"}
            return JobInfo(job_id, JobStatus.RUNNING, metadata=metadata)

    fake = Anything()
    _refused_by_every_call(RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake), batch_id)
    assert fake.stopped == []


# -- the story, through common.ai's own operator -------------------------------------------


def _run_task(
    monkeypatch: pytest.MonkeyPatch, fake: FakeRay, result_path: str, secret: str, prompts: list[str]
) -> TaskDeferred | dict:
    """One try of common.ai's ``LLMBatchOperator`` on the fake cluster, in a deployment signing with
    ``secret``: the trigger it defers to (it submitted or re-attached), or the manifest it landed."""
    monkeypatch.setenv("AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET", secret)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_LLM", json.dumps({"conn_type": "ray", "host": HOST, "password": TOKEN})
    )
    monkeypatch.setattr(adapter_module, "_FixedRayHook", lambda settings: fake)
    operator = common_ai_operator(result_path, prompts)
    context = _task_context(monkeypatch, task=operator)
    try:
        return operator.execute(context)
    except TaskDeferred as deferred:
        return deferred


def _prods_running_job(monkeypatch: pytest.MonkeyPatch, fake: FakeRay, result_path: str) -> str:
    deferred = _run_task(monkeypatch, fake, result_path, PROD_SECRET, ["Review: 'great'"])
    assert isinstance(deferred, TaskDeferred)
    return deferred.trigger.batch_id


def test_dev_does_not_stop_prods_job_when_its_prompts_differ(
    fake: WatchedRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result_path = f"file://{tmp_path}/shared-results"
    prods = _prods_running_job(monkeypatch, fake, result_path)

    deferred = _run_task(monkeypatch, fake, result_path, DEV_SECRET, ["Review: 'awful'"])

    assert fake.stopped == []
    assert isinstance(deferred, TaskDeferred) and deferred.trigger.batch_id not in (prods, None)
    assert fake.jobs[prods].status == JobStatus.PENDING


def test_dev_does_not_land_prods_results_when_its_prompts_match(
    fake: WatchedRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result_path = f"file://{tmp_path}/shared-results"
    prods = _prods_running_job(monkeypatch, fake, result_path)
    output = Path(fake.jobs[prods].metadata[OUTPUT_META])
    fake.jobs[prods] = replace(fake.jobs[prods], status=JobStatus.SUCCEEDED)
    _commit(output, prods, [_ok(0, "prod's answer")], [])

    landed = _run_task(monkeypatch, fake, result_path, DEV_SECRET, ["Review: 'great'"])

    # Dev submitted a job of its own (common.ai's answer to "not found") instead of landing prod's.
    assert isinstance(landed, TaskDeferred), f"dev landed prod's batch: {landed}"
    assert landed.trigger.batch_id != prods
    assert fake.stopped == []
