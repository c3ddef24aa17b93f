"""Two deployments of one common.ai DAG never share a batch folder, and a folder's foreign result fails.

common.ai's idempotency key hashes dag, task, run id and map index with no secret, so dev and prod
running one ``@task.llm_batch`` DAG against one result store have the same key. Named by it, their
jobs shared ``<result_path>/_raybatch/<key>/output`` and the run key ``common-ai-<key>``: the last
commit replaced the other deployment's result (whose task then passed with every request
``missing``), and a job of one waited on the other's staging for 150 s, then failed, on every try.
The adapter names both by an HMAC of the key under the deployment's key (settings.batch_key); and a
job that SUCCEEDED but whose folder holds no result of it fails its landing, naming the folder and
the other job, instead of landing nothing. Batch ids: tests/security/test_common_ai_batch_ids.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow.providers.common.ai", reason="needs the common-ai extra")

from airflow.providers.common.ai.batch.output_schema import build_output_spec  # noqa: E402
from airflow.providers.common.ai.batch.polling import terminal_event  # noqa: E402
from airflow.sdk.exceptions import TaskDeferred  # noqa: E402

from airflow_provider_raybatch.common_ai import settings as job  # noqa: E402
from airflow_provider_raybatch.common_ai.adapter import KEY_META, OUTPUT_META, RayBatchAdapter  # noqa: E402
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus  # noqa: E402
from airflow_provider_raybatch.jobs import job_shipping  # noqa: E402
from airflow_provider_raybatch.jobs.deployment_secret import signing_key  # noqa: E402
from airflow_provider_raybatch.pipeline.stage import ownership  # noqa: E402
from airflow_provider_raybatch.pipeline.storage import OutputLayout  # noqa: E402
from airflow_provider_raybatch.shared.exceptions import RayJobFailedError  # noqa: E402
from airflow_provider_raybatch.shared.job_ids import TaskTry  # noqa: E402
from tests.security.test_common_ai_batch_ids import (  # noqa: E402
    DEV_SECRET,
    PROD_SECRET,
    SETTINGS,
    TRY,
    WatchedRay,
    _task_context,
    common_ai_operator,
)
from tests.unit.common_ai.test_adapter import HOST, TOKEN, _commit, _ok  # noqa: E402

#: common.ai's short key of one task instance: the same in every deployment.
KEY16 = "4fa874f6554bd2b3"


@pytest.fixture(autouse=True)
def prod(monkeypatch: pytest.MonkeyPatch) -> None:
    """This deployment is prod, with the ``ray_llm`` connection common.ai's operator is given."""
    monkeypatch.setenv("AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET", PROD_SECRET)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_LLM", json.dumps({"conn_type": "ray", "host": HOST, "password": TOKEN})
    )


@pytest.fixture
def fake() -> WatchedRay:
    return WatchedRay()


@pytest.fixture
def specs(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The run key of each job submitted, by its output folder (the spec travels in the job package)."""
    shipped: dict[str, str] = {}
    real = job_shipping.upload_runtime_env

    def recording(hook: Any, spec: Any, *args: Any) -> Any:  # Any: as the real function.
        shipped[spec.output_uri] = spec.run_key
        return real(hook, spec, *args)

    monkeypatch.setattr(job_shipping, "upload_runtime_env", recording)
    return shipped


def _submitted_by(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, result_path: str, secret: str, prompts: list[str]
) -> JobInfo:
    """One try of common.ai's operator in the deployment signing with ``secret``: the job it submitted."""
    monkeypatch.setenv("AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET", secret)
    monkeypatch.setattr("airflow_provider_raybatch.common_ai.adapter._FixedRayHook", lambda settings: fake)
    operator = common_ai_operator(result_path, prompts)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(_task_context(monkeypatch, task=operator))
    return fake.jobs[deferred.value.trigger.batch_id]


def _submit_in_try(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, result_path: str, task_try: TaskTry
) -> JobInfo:
    """The adapter's own submit, inside ``task_try`` of this deployment (no common.ai state between)."""
    task = SimpleNamespace(task_id=task_try.task_id, result_path=result_path, llm_conn_id="ray_llm")
    _task_context(monkeypatch, task_try, task=task)
    adapter = RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)
    result = adapter.submit(
        [{"prompt": "Review: 'great'"}],
        model="tiny",
        idempotency_key=KEY16,
        input_fingerprint="f" * 64,
        output_spec=build_output_spec(str),
        request_params=SETTINGS,
    )
    return fake.jobs[result.batch_id]


# -- the folder and run key carry the deployment -----------------------------------------------------


def test_the_batch_key_is_the_deployments_and_stable_within_one() -> None:
    prod, dev = signing_key(PROD_SECRET), signing_key(DEV_SECRET)
    assert job.batch_key(KEY16, prod) != job.batch_key(KEY16, dev)
    assert job.batch_key(KEY16, prod) == job.batch_key(KEY16, prod)
    assert job.batch_key(KEY16, prod) != job.batch_key("4fa874f6554bd2b4", prod)
    assert KEY16 not in job.batch_key(KEY16, prod) and len(job.batch_key(KEY16, prod)) == 16


def test_two_deployments_of_one_dag_get_two_folders_and_two_run_keys(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, tmp_path: Path, specs: dict[str, str]
) -> None:
    result_path = f"file://{tmp_path}/shared-results"
    prods = _submitted_by(monkeypatch, fake, result_path, PROD_SECRET, ["PROD prompt: customer 4711"])
    devs = _submitted_by(monkeypatch, fake, result_path, DEV_SECRET, ["dev prompt"])

    prod_folder, dev_folder = prods.metadata[OUTPUT_META], devs.metadata[OUTPUT_META]
    assert prods.metadata[KEY_META] == devs.metadata[KEY_META]  # common.ai's key: one for both
    assert prod_folder != dev_folder
    assert specs[prod_folder] != specs[dev_folder]
    assert prods.metadata[KEY_META] not in prod_folder + dev_folder + specs[prod_folder] + specs[dev_folder]


def test_one_deployments_retries_share_their_folder_and_run_key(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, tmp_path: Path, specs: dict[str, str]
) -> None:
    """A retry's job resumes what an earlier try's job staged: same key and secret, same folder."""
    result_path = f"file://{tmp_path}/results"
    first = _submit_in_try(monkeypatch, fake, result_path, TRY)
    second = _submit_in_try(monkeypatch, fake, result_path, replace(TRY, try_number=2))

    assert first.job_id != second.job_id
    assert first.metadata[OUTPUT_META] == second.metadata[OUTPUT_META]
    assert list(specs) == [first.metadata[OUTPUT_META]]  # one folder, one run key
    adapter = RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)
    assert adapter.find_orphaned_batch(KEY16, "f" * 64, not_before="") in (first.job_id, second.job_id)


def test_the_two_deployments_jobs_never_wait_on_each_others_staging(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, tmp_path: Path, specs: dict[str, str]
) -> None:
    """Prod's job runs; dev's job of the same DAG run claims its own staging at once."""
    result_path = f"file://{tmp_path}/shared-results"
    prods = _submitted_by(monkeypatch, fake, result_path, PROD_SECRET, ["PROD prompt"])
    devs = _submitted_by(monkeypatch, fake, result_path, DEV_SECRET, ["dev prompt"])
    run = {"dag_id": TRY.dag_id, "task_id": TRY.task_id, "run_id": TRY.run_id, "map_index": "-1"}
    clock = [1000.0]

    def claim(info: JobInfo) -> ownership.Owner | None:
        """The job's claim on its staging, on a clock that a wait moves on."""
        output_uri = info.metadata[OUTPUT_META]
        return ownership.claim(
            OutputLayout(output_uri, specs[output_uri]),
            ownership.Owner(info.job_id, run, clock[0]),
            job_alive=lambda other: other == prods.job_id,  # prod's job runs
            now=lambda: clock[0],
            sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds),
            job_run=lambda other: run,  # Ray's metadata: the same DAG run in both deployments
        )

    assert claim(prods) is None
    started = clock[0]
    assert claim(devs) is None  # took over nobody's staging
    assert clock[0] - started == ownership.SETTLE_SECONDS  # its own claim's settling: no wait on prod's job


# -- a folder whose result is not the job's fails the landing -----------------------------------------


def test_a_succeeded_jobs_folder_committed_by_another_job_fails_its_task_loudly(
    monkeypatch: pytest.MonkeyPatch, fake: WatchedRay, tmp_path: Path
) -> None:
    """Another job's commit in prod's folder (a re-created run's job, or one planted by whoever can
    write the result store): prod's task fails naming the folder and that job, instead of passing
    with every request "missing" (common.ai's default fail_on_partial_error=False)."""
    result_path = f"file://{tmp_path}/shared-results"
    prods = _submitted_by(monkeypatch, fake, result_path, PROD_SECRET, ["PROD prompt: customer 4711"])
    other = replace(TRY, try_number=3).submission_id(signing_key(DEV_SECRET))
    output = Path(prods.metadata[OUTPUT_META])
    fake.jobs[prods.job_id] = replace(prods, status=JobStatus.SUCCEEDED)
    _commit(output, other, [_ok(0, "someone else's answer")], [])

    operator = common_ai_operator(result_path, ["PROD prompt: customer 4711"])
    context = _task_context(monkeypatch, task=operator)
    adapter = RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)
    event = terminal_event(prods.job_id, adapter.get_batch(prods.job_id))
    with pytest.raises(RayJobFailedError) as err:
        operator.execute_complete(context, event)

    message = str(err.value)
    assert str(output) in message and other in message and prods.job_id in message
    assert err.value.status == "superseded"


@pytest.mark.parametrize(
    ("status", "common_ai_status"),
    [(JobStatus.STOPPED, "cancelled"), (JobStatus.FAILED, "failed")],
)
def test_a_job_that_did_not_succeed_committed_nothing_when_its_folder_holds_anothers(
    fake: WatchedRay, tmp_path: Path, status: JobStatus, common_ai_status: str
) -> None:
    """Stopped or failed before its commit: nothing to land, and common.ai fails the batch itself
    (a cancelled one also clears its state, so the retry submits a job of its own)."""
    job_id = TRY.submission_id(signing_key(PROD_SECRET))
    output = tmp_path / "out"
    fake.jobs[job_id] = JobInfo(
        job_id, status, message="m", metadata={**TRY.metadata(), OUTPUT_META: str(output)}
    )
    _commit(output, "raybatch-another-job", [_ok(0, "x")], [])
    adapter = RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)

    assert adapter.get_batch(job_id).status == common_ai_status
    assert list(adapter.iter_results(job_id)) == []


def test_a_succeeded_job_whose_folder_holds_no_manifest_fails_its_landing(
    fake: WatchedRay, tmp_path: Path
) -> None:
    """A job that SUCCEEDED committed one: none there means it was deleted, or Airflow cannot read
    the folder; either way nothing would land."""
    job_id = TRY.submission_id(signing_key(PROD_SECRET))
    output = tmp_path / "out"
    fake.jobs[job_id] = JobInfo(
        job_id, JobStatus.SUCCEEDED, message="m", metadata={**TRY.metadata(), OUTPUT_META: str(output)}
    )
    adapter = RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)

    with pytest.raises(RayJobFailedError, match="does not exist") as err:
        list(adapter.iter_results(job_id))
    assert str(output) in str(err.value)
