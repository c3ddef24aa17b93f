"""The OpenAI provider's ``OpenAITriggerBatchOperator`` against our Batch API, for real.

A real ``airflow standalone`` (scheduler, triggerer, API server with the provider's Batch API
plugin) runs dags/openai_provider_batch.py: its tasks reach the Batch API through the real
apache-airflow-providers-openai hook and an ``openai`` connection whose host is the API server's
``/openai/v1`` and whose password is an Airflow API token. Each batch is a run of
dags/openai_batch_api.py on the local Ray cluster with vLLM's CPU engine: deferred
(``OpenAIBatchTrigger``) and waiting in the worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import quote

# The common-ai extra (scripts/setup_envs.sh installs it): without it these tests fail, never skip.
import airflow.providers.openai  # noqa: F401
import httpx
import pytest

from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID
from tests.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA
from tests.integration.standalone import Airflow, airflow_standalone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

API_PORT = 8399
DAG_ID = "openai_provider_batch"
USER, PASSWORD = "batchuser", "batch-pass-9"


def _token(airflow: Airflow) -> str:
    answer = httpx.post(
        f"{airflow.url}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=30
    )
    answer.raise_for_status()
    return answer.json()["access_token"]


@pytest.fixture(scope="module")
def airflow(ray_cluster, tiny_model, tmp_path_factory) -> Iterator[Airflow]:
    home = tmp_path_factory.mktemp("airflow-openai-provider")
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    extra_env = {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__RAYBATCH__OPENAI_FILES_URI": str(home / "openai-files"),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_MODEL": str(tiny_model),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_ENGINE_KWARGS": json.dumps(CPU_ENGINE_KWARGS),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_REPLICA_RESOURCES": json.dumps(CPU_REPLICA),
    }
    with airflow_standalone(
        home, API_PORT, ray_cluster.connection_json(), {DEFAULT_DAG_ID, DAG_ID}, extra_env, token=_token
    ) as instance:
        yield instance


def test_openai_trigger_batch_operator_completes_on_our_batch_api(airflow: Airflow) -> None:
    token = _token(airflow)
    # The connection a DAG written for OpenAI already uses, pointed at our Batch API.
    connection = {"connection_id": "openai_raybatch", "conn_type": "openai",
                  "host": f"{airflow.url}/openai/v1", "password": token}  # fmt: skip
    assert airflow.api("POST", "/connections", json=connection).status_code == 201
    for dag_id in (DAG_ID, DEFAULT_DAG_ID):
        airflow.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    run_id = airflow.trigger(DAG_ID, "2026-11-22", {"max_tokens": 8})

    def finished():
        run = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}").json()
        return run if run["state"] in ("success", "failed") else None

    run = airflow.wait("the DAG run to finish", finished, timeout=1200, every=5)
    states = {
        ti["task_id"]: ti["state"]
        for ti in airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances").json()[
            "task_instances"
        ]
    }
    assert run["state"] == "success", (states, (airflow.home / "standalone.log").read_text()[-6000:])

    def xcom(task_id: str):
        path = f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{task_id}/xcomEntries/return_value"
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
    ti = airflow.task_instance(DAG_ID, run_id, "batch_deferred")
    logs = airflow.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/batch_deferred/logs/{ti['try_number']}"
    )
    assert "Deferring batch" in logs.text
    assert token not in logs.text
