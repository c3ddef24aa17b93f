"""The OpenAI-compatible Batch API, driven by the official ``openai`` client.

A real `airflow standalone` serves the provider's FastAPI plugin under /openai with Airflow's own
auth (simple auth manager, real users and passwords, JWTs from /auth/token); each batch is a run of
dags/openai_batch_api.py on the scheduler and triggerer, on the local Ray cluster with vLLM's CPU
engine. Files live in the embedded default store, a local folder.

The same server runs dags/openai_provider_batch.py: the OpenAI provider's
``OpenAITriggerBatchOperator`` reaches the Batch API through the real apache-airflow-providers-openai
hook and an ``openai`` connection whose host is the API server's ``/openai/v1`` and whose password is an
Airflow API token, deferred (``OpenAIBatchTrigger``) and waiting in the worker. (The session's shared
server for both: each `airflow standalone` costs a 2-core CI machine a minute and a half to start.)
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

# The common-ai extra (scripts/setup_envs.sh installs it): without it these tests fail, never skip.
import airflow.providers.openai  # noqa: F401
import httpx
import openai
import pytest

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID
from tests.integration.deployments import user_token
from tests.integration.standalone import Airflow

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

PROVIDER_DAG_ID = "openai_provider_batch"


@pytest.fixture
def airflow(shared_airflow: Airflow) -> Airflow:
    """The session's shared deployment: its Batch API keeps files in a local folder and runs batches on
    the tiny model (tests/integration/deployments.py)."""
    return shared_airflow


def client_for(airflow: Airflow, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{airflow.url}/openai/v1", api_key=api_key, max_retries=0, timeout=60)


def chat(custom_id: str, text: str, max_tokens: int) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens},
    }


def upload(client: openai.OpenAI, path: Path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    with path.open("rb") as data:
        uploaded = client.files.create(file=data, purpose="batch")
    assert (
        uploaded.purpose == "batch"
        and uploaded.bytes == path.stat().st_size
        and uploaded.filename == path.name
    )
    return uploaded.id


def test_batch_lifecycle_with_the_official_client(airflow: Airflow, tmp_path: Path) -> None:
    client = client_for(airflow, user_token(airflow, "batchuser"))
    lines = [chat(f"req-{i}", f"Question {i}?", 4 + i % 3) for i in range(16)]
    lines += [
        chat("req-3", "duplicate id", 4),
        {**chat("wrong-url", "x", 4), "url": "/v1/embeddings"},
        "{not json",
    ]
    input_file_id = upload(client, tmp_path / "requests.jsonl", lines)
    assert client.files.retrieve(input_file_id).id == input_file_id
    assert client.files.content(input_file_id).text.splitlines()[0] == json.dumps(lines[0])

    batch = client.batches.create(
        input_file_id=input_file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "qa"},
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"team": "qa"}
    assert batch.request_counts.total == len(lines) and batch.expires_at == batch.created_at + 24 * 3600
    seen = {batch.status}

    def finished():
        current = client.batches.retrieve(batch.id)
        seen.add(current.status)
        return current if current.status in ("completed", "failed", "cancelled", "expired") else None

    done = airflow.wait("the batch to finish", finished, timeout=900)
    assert done.status == "completed", done
    assert "in_progress" in seen
    assert done.request_counts.model_dump() == {"total": 19, "completed": 16, "failed": 3}
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.failed_at is None and done.cancelled_at is None

    outputs = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    # joined by custom_id
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(16))
    for line in outputs:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert 0 < body["usage"]["completion_tokens"] <= 4 + int(line["custom_id"].split("-")[1]) % 3
    assert sorted((line["custom_id"] or "", line["error"]["code"]) for line in errors) == [
        ("", "invalid_json"),
        ("req-3", "duplicate_custom_id"),
        ("wrong-url", "invalid_url"),
    ]
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes == len(
        client.files.content(done.output_file_id).content
    )

    listed = client.batches.list(limit=10)
    assert batch.id in [b.id for b in listed.data]
    assert client.files.delete(input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(input_file_id)


LONG_BATCH_LINES = 3000


def _long_batch(client: openai.OpenAI, path: Path, completion_window: str):
    """A batch of 3000 chat lines of 200 tokens each: long enough to be caught while it runs (200
    lines could end within the expiry test's 45 s window on a quiet machine, and in CI on 4aa3358 so
    did 600: the job SUCCEEDED before the expiry stopped it)."""
    lines = [chat(f"long-{i}", f"Tell a long story number {i}.", 200) for i in range(LONG_BATCH_LINES)]
    input_file_id = upload(client, path, lines)
    return client.batches.create(
        input_file_id=input_file_id, endpoint="/v1/chat/completions", completion_window=completion_window
    )


def test_openai_trigger_batch_operator_completes_on_our_batch_api(airflow: Airflow) -> None:
    token = user_token(airflow, "batchuser")
    # The connection a DAG written for OpenAI already uses, pointed at our Batch API.
    connection = {
        "connection_id": "openai_raybatch",
        "conn_type": "openai",
        "host": f"{airflow.url}/openai/v1",
        "password": token,
    }
    assert airflow.api("POST", "/connections", json=connection).status_code == 201
    for dag_id in (PROVIDER_DAG_ID, DEFAULT_DAG_ID):
        airflow.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    run_id = airflow.trigger(PROVIDER_DAG_ID, "2026-11-22", {"max_tokens": 8})
    run_path = f"/dags/{PROVIDER_DAG_ID}/dagRuns/{quote(run_id)}"

    def finished():
        run = airflow.api("GET", run_path).json()
        return run if run["state"] in ("success", "failed") else None

    run = airflow.wait("the DAG run to finish", finished, timeout=1200, every=5)
    tis = airflow.api("GET", f"{run_path}/taskInstances").json()["task_instances"]
    states = {ti["task_id"]: ti["state"] for ti in tis}
    assert run["state"] == "success", (states, (airflow.home / "standalone.log").read_text()[-6000:])

    def xcom(task_id: str):
        path = f"{run_path}/taskInstances/{task_id}/xcomEntries/return_value"
        return airflow.api("GET", path, params={"deserialize": True}).json()["value"]

    for reader, batch_task in (
        ("read_answers", "batch_deferred"),
        ("read_answers_in_worker", "batch_in_worker"),
    ):
        batch_id = xcom(batch_task)
        assert str(batch_id).startswith("batch_")
        result = xcom(reader)
        if isinstance(result, str):
            result = json.loads(result)
        assert result["status"] == "completed"
        assert result["counts"] == {"total": 5, "completed": 4, "failed": 1}
        assert sorted(result["answers"]) == ["q-0", "q-1", "q-2", "q-3"]
        # The request our engine cannot honour failed alone, named in the error file.
        assert result["errors"]["q-tools"]["code"] == "unsupported_parameter"
        assert "body.tools is not supported" in result["errors"]["q-tools"]["message"]
    # The deferred one waited in the triggerer, in the OpenAI provider's own trigger.
    ti = airflow.task_instance(PROVIDER_DAG_ID, run_id, "batch_deferred")
    logs = airflow.api("GET", f"{run_path}/taskInstances/batch_deferred/logs/{ti['try_number']}")
    assert "Deferring batch" in logs.text
    assert token not in logs.text


def test_cancel_a_running_batch_stops_its_ray_job(airflow: Airflow, ray_connection, tmp_path: Path) -> None:
    client = client_for(airflow, user_token(airflow, "batchuser"))
    batch = _long_batch(client, tmp_path / "long.jsonl", completion_window="24h")
    hook = RayHook()

    def running_job():
        if client.batches.retrieve(batch.id).status != "in_progress":
            return None
        jobs = [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == batch.id]
        return jobs[0] if jobs and jobs[0].status.value == "RUNNING" else None

    job = airflow.wait("the batch's Ray job to run", running_job, timeout=900)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None

    cancelled = airflow.wait(
        "the batch to be cancelled",
        lambda: b if (b := client.batches.retrieve(batch.id)).status == "cancelled" else None,
        timeout=180,
    )
    assert cancelled.cancelled_at >= cancelled.cancelling_at and cancelled.output_file_id is None
    status = airflow.wait(
        "the Ray job to stop",
        lambda: s if (s := hook.get_job_status(job.job_id)).is_terminal else None,
        timeout=120,
    )
    assert status.value == "STOPPED"
    # never resubmitted
    assert len([j for j in hook.list_jobs() if j.metadata.get("airflow_run_id") == batch.id]) == 1
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_batch_past_its_completion_window_expires_and_its_ray_job_stops(
    airflow: Airflow, ray_connection, tmp_path: Path
) -> None:
    """A 45 s window (the API takes durations besides OpenAI's "24h") on a batch that needs longer:
    the window is the batch task's deadline, so the task stops its Ray job then; reads only read."""
    client = client_for(airflow, user_token(airflow, "batchuser"))
    batch = _long_batch(client, tmp_path / "slow.jsonl", completion_window="45s")
    assert batch.expires_at == batch.created_at + 45
    hook = RayHook()

    def ours() -> list:
        return [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == batch.id]

    expired = airflow.wait(
        "the batch to expire",
        lambda: b if (b := client.batches.retrieve(batch.id)).status == "expired" else None,
        timeout=300,
    )
    assert expired.expired_at >= expired.expires_at and expired.output_file_id is None
    assert expired.completed_at is None and expired.request_counts.total == LONG_BATCH_LINES
    jobs = ours()
    assert len(jobs) <= 1
    for job in jobs:  # submitted before the window ended (it takes ~20 s here): stopped with the run

        def ended(job_id: str = job.job_id) -> object:
            return status if (status := hook.get_job_status(job_id)).is_terminal else None

        assert airflow.wait("the Ray job to stop", ended, timeout=120).value == "STOPPED"
    assert client.batches.retrieve(batch.id).status == "expired"  # and it stays so


def test_airflow_auth_guards_the_api(airflow: Airflow, tmp_path: Path) -> None:
    with pytest.raises(openai.PermissionDeniedError):  # not an Airflow token
        client_for(airflow, "sk-not-an-airflow-token").batches.list()
    anonymous = httpx.get(f"{airflow.url}/openai/v1/batches", timeout=30)  # no token at all
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "authentication_error"
    reader = client_for(airflow, user_token(airflow, "reader"))
    assert reader.batches.list().object == "list"  # a viewer may read
    with pytest.raises(openai.PermissionDeniedError):  # but not upload or start batches
        upload(reader, tmp_path / "r.jsonl", [chat("r", "x", 2)])
