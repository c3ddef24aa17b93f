"""Shared fixtures of the unit tests: a fake Ray dashboard (respx) and an Airflow connection to it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import respx

from airflow_provider_raybatch.hooks.ray import RayConnectionSettings, RayHook

RAY_URL = "http://ray.test:8265"
RAY_CONN_ID = "ray_unit"
RAY_TOKEN = "s3cr3t-t0ken-value"


@pytest.fixture
def ray_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (from the environment) to the fake dashboard; returns its id."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{RAY_CONN_ID.upper()}",
        json.dumps(
            {
                "conn_type": "ray",
                "host": "ray.test",
                "port": 8265,
                "password": RAY_TOKEN,
                # No retries unless a test asks: a refused call should fail at once here.
                "extra": {"retry_window_seconds": 0},
            }
        ),
    )
    return RAY_CONN_ID


def nodes_payload(*node_resources: dict[str, float]) -> dict[str, Any]:  # Any: JSON values.
    """The state API's answer listing alive nodes with these total resources."""
    nodes = [
        {"node_id": f"node{i}", "is_head_node": i == 0, "state": "ALIVE", "resources_total": resources, "labels": {}}
        for i, resources in enumerate(node_resources)
    ]
    return {"result": True, "msg": "", "data": {"result": {"total": len(nodes), "result": nodes}}}


@pytest.fixture
def ray_api() -> Iterator[respx.MockRouter]:
    """The fake Ray Jobs API; every test adds the routes it needs."""
    with respx.mock(base_url=RAY_URL, assert_all_called=False, assert_all_mocked=True) as router:
        # A roomy cluster for the operator's layout check; tests of that check replace the answer.
        router.get("/api/v0/nodes").respond(json=nodes_payload({"CPU": 64.0, "GPU": 8.0}))
        yield router


@pytest.fixture
def hook() -> RayHook:
    """A RayHook whose settings point at the fake dashboard, without an Airflow connection."""
    ray_hook = RayHook(ray_conn_id="unused")
    ray_hook._settings = RayConnectionSettings(
        base_url=RAY_URL,
        headers={"Authorization": f"Bearer {RAY_TOKEN}"},
        cookies={},
        verify=True,
        timeout_seconds=5.0,
        retry_window_seconds=0,
    )
    return ray_hook


@pytest.fixture
def job_payload() -> Callable[..., dict[str, Any]]:
    """Ray's JSON job details for a job id and status."""

    def make(job_id: str, status: str, **extra: Any) -> dict[str, Any]:  # Any: JSON values.
        payload = {
            "type": "SUBMISSION",
            "job_id": None,
            "submission_id": job_id,
            "status": status,
            "entrypoint": "python -m airflow_provider_raybatch.pipeline --spec '{}'",
            "message": "",
            "metadata": {},
            "start_time": 1_700_000_000_000,
            "end_time": None,
        }
        payload.update(extra)
        return payload

    return make
