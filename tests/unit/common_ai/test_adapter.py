"""The raybatch adapter against common.ai's contract, with a fake Ray cluster (an in-memory hook).

The real package's dispatch builds it (entry point, conn_types); its request lines are common.ai's
OpenAI adapter's; its results are parsed from files as our pipeline commits them. The real Ray
cluster, Airflow and common.ai's operator run in tests/integration/test_common_ai.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow.providers.common.ai", reason="needs the common-ai extra")

from airflow.providers.common.ai.batch import dispatch  # noqa: E402
from airflow.providers.common.ai.batch.output_schema import build_output_spec  # noqa: E402
from airflow.providers.common.ai.exceptions import (  # noqa: E402
    BatchProviderNotYetSupportedError,
    LLMBatchLimitExceededError,
    LLMBatchModelMismatchError,
)
from airflow.sdk import Connection  # noqa: E402

from airflow_provider_raybatch.common_ai import adapter as adapter_module  # noqa: E402
from airflow_provider_raybatch.common_ai.adapter import RayBatchAdapter, batch_status  # noqa: E402
from airflow_provider_raybatch.common_ai.settings import batch_key  # noqa: E402
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus  # noqa: E402
from airflow_provider_raybatch.jobs.deployment_secret import signing_key  # noqa: E402
from airflow_provider_raybatch.shared.exceptions import (  # noqa: E402
    BatchSpecError,
    RayJobAlreadyExistsError,
    RayJobFailedError,
)
from airflow_provider_raybatch.shared.job_ids import TaskTry  # noqa: E402
from tests.unit.conftest import TEST_DEPLOYMENT_SECRET  # noqa: E402

TOKEN = "ray-t0ken-never-logged"
HOST = "http://ray.test:8265"
KEY = "0123456789abcdef"
#: The try the ``context`` fixture runs, and the id this deployment gives its job (ids of other
#: deployments, forged or malformed ones: tests/security/test_common_ai_batch_ids.py).
TRY = TaskTry("reviews", "manual__1", "classify", -1, 1)
JOB = TRY.submission_id(signing_key(TEST_DEPLOYMENT_SECRET))


class FakeRay:
    """The RayHook calls the adapter makes, on a dict of jobs; records what was submitted."""

    dashboard_url = HOST

    def __init__(self) -> None:
        self.jobs: dict[str, JobInfo] = {}
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        self.logs = ""

    def submit_job(self, entrypoint: str, *, submission_id: str, runtime_env: dict, metadata: dict) -> str:
        if submission_id in self.jobs:
            raise RayJobAlreadyExistsError(f"{submission_id} exists", status_code=400)
        self.submitted.append(
            {
                "entrypoint": entrypoint,
                "submission_id": submission_id,
                "runtime_env": runtime_env,
                "metadata": metadata,
            }
        )
        self.jobs[submission_id] = JobInfo(
            submission_id, JobStatus.PENDING, metadata=metadata, start_time_ms=0
        )
        return submission_id

    def upload_package(self, package: Any) -> str:
        return package.uri

    def get_job_info(self, job_id: str) -> JobInfo:
        return self.jobs[job_id]

    def list_jobs(self) -> list[JobInfo]:
        return list(self.jobs.values())

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True

    def get_job_logs(self, job_id: str) -> str:
        return self.logs

    def get_job_log_tail(self, job_id: str, lines: int = 40) -> str:
        return "\n".join(self.logs.splitlines()[-lines:])


@pytest.fixture
def ray_conn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    conn = {"conn_type": "ray", "host": HOST, "password": TOKEN}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_LLM", json.dumps(conn))
    return conn


@pytest.fixture
def context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ray_conn: dict) -> dict[str, Any]:
    """What get_current_context gives inside common.ai's LLMBatchOperator."""
    task = SimpleNamespace(
        task_id="classify", result_path=f"file://{tmp_path}/results", llm_conn_id="ray_llm"
    )
    ti = SimpleNamespace(dag_id="reviews", run_id="manual__1", task_id="classify", map_index=-1, try_number=1)
    ctx = {"task": task, "ti": ti, "dag_run": SimpleNamespace(run_after=None)}
    monkeypatch.setattr(adapter_module, "_context", lambda: ctx)
    return ctx


@pytest.fixture
def fake() -> FakeRay:
    return FakeRay()


@pytest.fixture
def adapter(fake: FakeRay) -> RayBatchAdapter:
    return RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=fake)


REQUESTS: list[Any] = [{"prompt": "Review: 'great'"}, {"prompt": "Review: 'bad'", "system_prompt": "French."}]
SETTINGS = {"raybatch": {"check_layout": False, "engine_kwargs": {"max_model_len": 512}}}


def _submit(adapter: RayBatchAdapter, output_type: type = str, **kwargs: Any):
    return adapter.submit(
        REQUESTS,
        model="tiny",
        idempotency_key=KEY,
        input_fingerprint="f" * 64,
        output_spec=build_output_spec(output_type),
        system_prompt="Summarize.",
        max_tokens=16,
        request_params={"temperature": 0, **SETTINGS},
        completion_window="24h",
        **kwargs,
    )


# -- dispatch: what common.ai does with our entry point -------------------------------------------


def test_common_ai_dispatch_finds_the_adapter_through_the_entry_point(ray_conn: dict) -> None:
    assert dispatch.get_adapter_class("ray", "raybatch:Qwen/Qwen2.5-1.5B-Instruct") is RayBatchAdapter
    built = dispatch.build_adapter("raybatch", llm_conn_id="ray_llm")
    assert isinstance(built, RayBatchAdapter)
    assert built._hook.dashboard_url == HOST
    assert built._hook.settings.headers == {"Authorization": f"Bearer {TOKEN}"}


def test_other_connection_types_are_refused_by_common_ai() -> None:
    with pytest.raises(BatchProviderNotYetSupportedError, match=r"accepts \['ray'\]"):
        dispatch.get_adapter_class("pydanticai", "raybatch:m")


def test_a_ray_connection_without_host_fails_naming_it() -> None:
    with pytest.raises(BatchSpecError, match="the ray connection has no host"):
        dispatch.build_adapter_from_connection("raybatch", Connection(conn_id="x", conn_type="ray"))


# -- validate_requests ---------------------------------------------------------------------------


def test_validate_refuses_two_models_and_foreign_prefixes(adapter: RayBatchAdapter, context: dict) -> None:
    spec = build_output_spec(str)
    with pytest.raises(LLMBatchModelMismatchError, match="runs one model"):
        adapter.validate_requests(
            [{"prompt": "a"}, {"prompt": "b", "model": "raybatch:other"}],
            model="m",
            output_spec=spec,
            idempotency_key=KEY,
        )
    with pytest.raises(LLMBatchModelMismatchError, match="Request 0 sets model='openai:gpt-5'"):
        adapter.validate_requests(
            [{"prompt": "a", "model": "openai:gpt-5"}], model="m", output_spec=spec, idempotency_key=KEY
        )


def test_validate_refuses_too_many_requests_with_the_remedy(
    adapter: RayBatchAdapter, context: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RayBatchAdapter, "max_requests", 2)
    with pytest.raises(
        LLMBatchLimitExceededError, match=r"at most 2 requests per batch; got 3.*\.expand\(\)"
    ):
        adapter.validate_requests(
            [{"prompt": "x"}] * 3, model="m", output_spec=build_output_spec(str), idempotency_key=KEY
        )


def test_validate_checks_job_settings_before_any_network_call(
    adapter: RayBatchAdapter, context: dict, fake: FakeRay
) -> None:
    with pytest.raises(BatchSpecError, match="concurrency"):
        adapter.validate_requests(
            REQUESTS,
            model="m",
            output_spec=build_output_spec(str),
            idempotency_key=KEY,
            request_params={"raybatch": {"concurrency": -1}},
        )
    assert fake.submitted == []


@pytest.mark.parametrize(
    ("conn", "named"),
    [
        ({"host": "127.0.0.1", "port": 8375}, r"port=8375 \(the port field\)"),
        ({"host": HOST, "extra": {"headers": {"X-Team": "a"}}}, "headers"),
        ({"host": HOST, "extra": {"verify": False}}, "verify"),
    ],
)
def test_a_connection_the_trigger_could_not_rebuild_fails_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, context: dict, conn: dict, named: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_LLM", json.dumps({"conn_type": "ray", "password": TOKEN, **conn}))
    built = dispatch.build_adapter("raybatch", llm_conn_id="ray_llm")
    with pytest.raises(BatchSpecError, match=rf"ray connection 'ray_llm': {named} would not reach") as err:
        built.validate_requests(REQUESTS, model="m", output_spec=build_output_spec(str), idempotency_key=KEY)
    assert TOKEN not in str(err.value)


# -- submit ----------------------------------------------------------------------------------------


def test_submit_writes_openai_lines_and_submits_our_pipeline(
    adapter: RayBatchAdapter, context: dict, fake: FakeRay, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    result = _submit(adapter)
    (job,) = fake.submitted
    assert result.batch_id == job["submission_id"]
    assert result.batch_id.startswith("raybatch-reviews-classify-manual__1-m-1-t1-")
    # Named by this deployment's key, not by common.ai's key (the same in every deployment).
    folder = tmp_path / "results" / "_raybatch" / batch_key(KEY, signing_key(TEST_DEPLOYMENT_SECRET))
    assert result.provider_input_ref == f"{folder}/input-ffffffffffffffff.jsonl"
    lines = [json.loads(line) for line in Path(result.provider_input_ref).read_text().splitlines()]
    # common.ai's OpenAI request lines, our settings stripped from the body.
    assert [line["custom_id"] for line in lines] == [f"{KEY}-0", f"{KEY}-1"]
    assert lines[0]["url"] == "/v1/chat/completions"
    assert lines[0]["body"] == {
        "temperature": 0,
        "model": "tiny",
        "max_completion_tokens": 16,
        "messages": [
            {"role": "system", "content": "Summarize."},
            {"role": "user", "content": "Review: 'great'"},
        ],
    }
    assert lines[1]["body"]["messages"][0] == {"role": "system", "content": "French."}
    assert job["metadata"]["common_ai_idempotency_key"] == KEY
    assert job["metadata"]["common_ai_input_fingerprint"] == "f" * 16
    assert job["metadata"]["raybatch_output_uri"] == f"{folder}/output"
    assert job["metadata"]["common_ai_request_count"] == "2"
    assert job["entrypoint"].startswith("python -m airflow_provider_raybatch.pipeline")
    assert f"{HOST}/#/jobs/{result.batch_id}" in caplog.text
    everything = json.dumps(fake.submitted) + caplog.text + Path(result.provider_input_ref).read_text()
    assert TOKEN not in everything


def test_structured_output_becomes_the_response_format_our_pipeline_reads(
    adapter: RayBatchAdapter, context: dict
) -> None:
    from typing import Literal

    result = _submit(adapter, output_type=Literal["positive", "negative"])
    body = json.loads(Path(result.provider_input_ref).read_text().splitlines()[0])["body"]
    assert body["response_format"]["type"] == "json_schema"
    # common.ai wraps a non-object type as {"response": ...}: our pipeline constrains decoding to it.
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["response"]["enum"] == ["positive", "negative"]


def test_submit_takes_the_next_free_id_when_one_is_taken(
    adapter: RayBatchAdapter, context: dict, fake: FakeRay
) -> None:
    first = _submit(adapter).batch_id
    second = _submit(adapter).batch_id
    assert second != first and "-a2-" in second


# -- while it runs, and after ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "committed", "expected"),
    [
        (JobStatus.PENDING, False, "in_progress"),
        (JobStatus.RUNNING, False, "in_progress"),
        (JobStatus.SUCCEEDED, True, "completed"),
        (JobStatus.STOPPED, False, "cancelled"),
        (JobStatus.STOPPED, True, "completed"),
        (JobStatus.FAILED, False, "failed"),
        (JobStatus.FAILED, True, "completed"),
    ],
)
def test_job_statuses_map_to_common_ais(status: JobStatus, committed: bool, expected: str) -> None:
    assert batch_status(status, committed) == expected


def _commit(output: Path, job_id: str, outputs: list[dict], errors: list[dict]) -> None:
    """What our pipeline leaves at output_uri: the version's JSONL parts, then manifest.json."""
    version = output / "versions" / "v1"
    for folder, lines in (("outputs", outputs), ("errors", errors)):
        (version / folder).mkdir(parents=True)
        (version / folder / "part-00000.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    manifest = {
        "status": "complete",
        "job_id": job_id,
        "output_uri": str(output),
        "rows_in": 3,
        "rows_out": 2,
        "rows_failed": 1,
        "outputs_uri": str(version / "outputs"),
        "errors_uri": str(version / "errors"),
    }
    (output / "manifest.json").write_text(json.dumps(manifest))


def _job(fake: FakeRay, status: JobStatus, output: Path, count: int = 3) -> str:
    """This deployment's job of :data:`TRY`, as the adapter submits it, writing to ``output``."""
    fake.jobs[JOB] = JobInfo(
        JOB,
        status,
        message="m",
        metadata={
            **TRY.metadata(),
            "raybatch_output_uri": str(output),
            "common_ai_request_count": str(count),
        },
    )
    return JOB


def _ok(index: int, text: str) -> dict:
    body = {
        "model": "tiny",
        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    return {
        "id": "b",
        "custom_id": f"{KEY}-{index}",
        "error": None,
        "response": {"status_code": 200, "body": body},
    }


def test_results_are_the_committed_lines_parsed_as_openai_output(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    error = {
        "id": "b",
        "custom_id": f"{KEY}-2",
        "response": None,
        "error": {"code": "unsupported_parameter", "message": "unsupported parameter: reasoning_effort"},
    }
    _commit(output, JOB, [_ok(0, "fine"), _ok(1, '"positive"')], [error])
    job_id = _job(fake, JobStatus.SUCCEEDED, output)
    assert adapter.get_batch(job_id).status == "completed"
    items = list(adapter.iter_results(job_id))
    assert [(i.index, i.provider_status) for i in items] == [(0, "success"), (1, "success"), (2, "errored")]
    assert items[0].raw == "fine" and items[0].usage == {"input_tokens": 5, "output_tokens": 2}
    assert items[2].error is not None and "reasoning_effort" in items[2].error["message"]
    assert adapter.extract_output(items[1], build_output_spec(str)).text == '"positive"'


def test_a_stopped_job_without_a_commit_is_cancelled_with_nothing_to_land(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path
) -> None:
    job_id = _job(fake, JobStatus.STOPPED, tmp_path / "none", count=4)
    state = adapter.get_batch(job_id)
    assert (state.status, state.counts) == (
        "cancelled",
        {"succeeded": 0, "errored": 0, "expired": 0, "cancelled": 4},
    )
    assert list(adapter.iter_results(job_id)) == []


def test_another_jobs_manifest_is_not_taken_for_this_ones(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path
) -> None:
    _commit(tmp_path / "out", "job-other", [_ok(0, "x")], [])
    job_id = _job(fake, JobStatus.FAILED, tmp_path / "out")
    fake.logs = "Traceback\nRuntimeError: engine died"
    state = adapter.get_batch(job_id)
    assert state.status == "failed"
    assert state.error_message is not None and "RuntimeError: engine died" in state.error_message
    assert list(adapter.iter_results(job_id)) == []


def test_a_job_of_ours_the_adapter_did_not_submit_is_refused_naming_why(
    adapter: RayBatchAdapter, fake: FakeRay
) -> None:
    """One of RayLLMBatchOperator's jobs, say: this deployment's, but with no output folder of ours."""
    fake.jobs[JOB] = JobInfo(JOB, JobStatus.SUCCEEDED, metadata=TRY.metadata())
    with pytest.raises(BatchSpecError, match="was not submitted by the raybatch common.ai adapter"):
        adapter.iter_results(JOB)


def test_an_unparsable_line_is_skipped_not_the_batch(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path
) -> None:
    _commit(tmp_path / "out", JOB, [_ok(0, "a"), {"no": "custom id"}], [])
    assert [i.index for i in adapter.iter_results(_job(fake, JobStatus.SUCCEEDED, tmp_path / "out"))] == [0]


def test_cancel_stops_the_ray_job(adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path) -> None:
    adapter.cancel_batch(_job(fake, JobStatus.RUNNING, tmp_path / "out"))
    assert fake.stopped == [JOB]


def test_progress_lines_go_to_the_task_log(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_provider_raybatch.shared.manifest import PROGRESS_LOG_MARKER

    caplog.set_level("INFO")
    fake.logs = (
        PROGRESS_LOG_MARKER + json.dumps({"rows_done": 2, "rows_total": 3, "elapsed_seconds": 4.0}) + "\n"
    )
    adapter.get_batch(_job(fake, JobStatus.RUNNING, tmp_path / "out"))
    assert f"Ray job {JOB}: 2 / 3 rows (66.7%)" in caplog.text


# -- orphans ---------------------------------------------------------------------------------------


def test_an_orphaned_job_is_found_only_when_ours_and_of_this_input(
    adapter: RayBatchAdapter, context: dict, fake: FakeRay
) -> None:
    job_id = _submit(adapter).batch_id
    assert adapter.find_orphaned_batch(KEY, "f" * 64, not_before="") == job_id
    assert adapter.find_orphaned_batch(KEY, "e" * 64, not_before="") is None  # other prompts
    # The same metadata on a job whose id this deployment did not sign (another deployment's).
    forged = JobInfo(
        "raybatch-forged", JobStatus.RUNNING, metadata=fake.jobs[job_id].metadata, start_time_ms=1
    )
    fake.jobs = {"raybatch-forged": forged}
    assert adapter.find_orphaned_batch(KEY, "f" * 64, not_before="") is None


def test_a_job_the_cluster_forgot_is_a_404_so_common_ai_submits_again(adapter: RayBatchAdapter) -> None:
    """A recorded job the cluster no longer knows (a new head): common.ai's own 404 test is
    ``status_code == 404``, and then it submits a new job (which resumes from our staging)."""
    from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator

    from airflow_provider_raybatch.shared.exceptions import RayJobNotFoundError

    class Forgetful(FakeRay):
        def get_job_info(self, job_id: str) -> JobInfo:
            raise RayJobNotFoundError("Ray job not found (GET /api/jobs/x -> 404)", status_code=404)

    with pytest.raises(RayJobNotFoundError) as err:
        RayBatchAdapter(api_key=TOKEN, base_url=HOST, client=Forgetful()).get_batch(JOB)
    assert LLMBatchOperator._is_not_found_error(err.value)


@pytest.mark.parametrize(
    ("planted", "named"),
    [
        # No job id: the run-key fallback, with an empty run key and fingerprint.
        ({"job_id": None}, "names no job"),
        # This job's id, its results read elsewhere.
        ({"job_id": JOB, "outputs_uri": "ELSEWHERE/outputs"}, "points at results outside the folder"),
        (
            {"job_id": JOB, "errors_uri": "OUT/versions/../../elsewhere"},
            "points at results outside the folder",
        ),
    ],
)
def test_a_manifest_planted_in_the_result_folder_fails_the_landing(
    adapter: RayBatchAdapter, fake: FakeRay, tmp_path: Path, planted: dict, named: str
) -> None:
    """The job's output folder is under result_path, which anyone who can write there may change: a
    manifest naming no job or results outside the folder is not this job's, and landing nothing
    would pass common.ai's task with every request missing, so it fails naming the folder."""
    output, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _commit(elsewhere, JOB, [_ok(0, "planted answer")], [])
    _commit(output, JOB, [], [])
    manifest = json.loads((output / "manifest.json").read_text())
    for key, value in planted.items():
        if isinstance(value, str):
            value = value.replace("ELSEWHERE", str(elsewhere / "versions" / "v1")).replace("OUT", str(output))
        manifest[key] = value
    if manifest["job_id"] is None:
        del manifest["job_id"]
        manifest.update(run_key="", spec_fingerprint="", outputs_uri=str(elsewhere / "versions/v1/outputs"))
    (output / "manifest.json").write_text(json.dumps(manifest))
    job_id = _job(fake, JobStatus.SUCCEEDED, output)

    with pytest.raises(RayJobFailedError, match=named) as err:
        list(adapter.iter_results(job_id))
    assert str(output) in str(err.value) and err.value.status == "superseded"
