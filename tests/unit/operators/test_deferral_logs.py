"""A run that succeeds logs no error-level line: not when the task defers, not when it completes.

When a task defers or ends, Airflow's task runner evaluates each of the operator's extra links in
the worker (``finalize``), and a link that reads an XCom goes through the supervisor to the API
server. For an XCom that does not exist (yet), the task SDK's client logs ``[error] XCom not found``
before returning None, though nothing failed (apache/airflow#73175). These tests run the operator's
path to deferral and to completion, then what ``finalize`` does, against Airflow's own client code
(``handle_get_xcom`` and ``Client``), and fail on any ERROR record: the stdlib's (``caplog``) and
structlog's, which the task SDK logs through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
import structlog
from airflow.sdk.api.client import Client
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import GetXCom

try:  # Airflow 3.3 moved the supervisor's answers to a task's requests into request_handlers
    from airflow.sdk.execution_time.request_handlers import handle_get_xcom
except ImportError:  # Airflow 3.2: the supervisor answered inline (supervisor.py, its GetXCom branch)
    from airflow.sdk.execution_time.comms import XComResult

    def handle_get_xcom(client: Client, msg: GetXCom) -> tuple[Any, dict[str, bool]]:  # Any: a comms model
        xcom = client.xcoms.get(
            msg.dag_id, msg.run_id, msg.task_id, msg.key, msg.map_index, msg.include_prior_dates
        )
        return XComResult.from_xcom_response(xcom), {}


from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.manifest import manifest_log_line
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.operators.test_llm_batch import MANIFEST, FakeCluster, FakeStateStore, FakeTI, make_operator

ERROR_LEVELS = {"error", "critical", "exception", "fatal"}


class FakeSupervisor:
    """The supervisor's side of a task's XCom reads, through Airflow's own handler and API client, with
    the execution API answering from the XComs ``ti`` pushed (404 for any other, as the server does)."""

    def __init__(self, ti: FakeTI) -> None:
        self.ti = ti
        self.reads: list[str] = []
        transport = httpx.MockTransport(self._answer)
        self.client = Client(base_url=None, dry_run=True, token="unit", transport=transport)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        *_, key = request.url.path.split("/")
        self.reads.append(key)
        if key in self.ti.xcoms:
            return httpx.Response(200, json={"key": key, "value": self.ti.xcoms[key]})
        return httpx.Response(
            404, json={"detail": {"reason": "not_found", "message": f"XCom {key} not found"}}
        )

    def send(self, msg: Any) -> Any:  # Any: the task SDK's comms messages.
        if not isinstance(msg, GetXCom):
            raise AssertionError(f"unexpected message to the supervisor: {msg!r}")
        response, _ = handle_get_xcom(self.client, msg)
        return response


@pytest.fixture
def supervisor(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSupervisor]:
    fake = FakeSupervisor(FakeTI())
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", fake, raising=False)
    yield fake


@pytest.fixture
def error_lines(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """Call it for every ERROR (or worse) line logged so far in the test, from the stdlib or structlog."""
    with structlog.testing.capture_logs() as events, caplog.at_level(logging.DEBUG):

        def logged() -> list[str]:
            stdlib = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
            return stdlib + [
                f"{e.get('logger_name', '')}: {e}" for e in events if e["log_level"] in ERROR_LEVELS
            ]

        yield logged


def finalize_links(op: RayLLMBatchOperator, ti: FakeTI) -> dict[str, str]:
    """What Airflow's task runner does with the extra links when the task defers or ends."""
    return {link.name: link.get_link(op, ti_key=ti) for link in op.operator_extra_links}  # type: ignore[arg-type]


def test_the_harness_sees_the_sdks_error_for_a_missing_xcom(
    supervisor: FakeSupervisor, error_lines: Callable[[], list[str]]
) -> None:
    """Without this, the tests below could pass by not seeing the line they look for."""
    from airflow.sdk.execution_time.xcom import XCom

    assert XCom.get_value(ti_key=supervisor.ti, key="not-pushed") is None  # type: ignore[arg-type]

    [line] = error_lines()
    assert "XCom not found" in line and "not-pushed" in line


def test_deferring_logs_no_error(
    ray_conn: str,
    ray_api: respx.MockRouter,
    job_payload: Any,
    supervisor: FakeSupervisor,
    error_lines: Callable[[], list[str]],
) -> None:
    FakeCluster(ray_api, job_payload)  # no earlier job: this try submits and defers
    op = make_operator(ray_conn_id=ray_conn)

    with pytest.raises(TaskDeferred):
        op.execute({"ti": supervisor.ti, "task_state_store": FakeStateStore()})
    links = finalize_links(op, supervisor.ti)

    assert links["Ray job"].endswith(f"/#/jobs/{op.job_id}")
    assert error_lines() == [], f"the deferral logged at ERROR level (XComs read: {supervisor.reads})"


def test_completing_logs_no_error(
    ray_conn: str, ray_api: respx.MockRouter, supervisor: FakeSupervisor, error_lines: Callable[[], list[str]]
) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": manifest_log_line(MANIFEST)})
    ti = supervisor.ti
    ti.xcoms.update({"job_id": "j1", "ray_dashboard_url": "http://ray.test:8265"})  # pushed before deferring
    op = make_operator(ray_conn_id=ray_conn)

    assert (
        op.execute_complete({"ti": ti}, job_event("success", "j1", "ok", "succeeded"))
        == MANIFEST["output_uri"]
    )
    links = finalize_links(op, ti)

    assert links["Ray job"] == "http://ray.test:8265/#/jobs/j1"
    assert error_lines() == [], f"the completion logged at ERROR level (XComs read: {supervisor.reads})"


def test_a_refused_spec_logs_its_own_error_and_no_other(
    ray_conn: str, ray_api: respx.MockRouter, supervisor: FakeSupervisor, error_lines: Callable[[], list[str]]
) -> None:
    """A spec refused before any job is submitted fails the task with its own message only: the "Ray
    job" link of a task with no job reads no XCom (else the SDK logs "XCom not found ...
    key='job_id'" at ERROR right after the refusal)."""
    op = make_operator(ray_conn_id=ray_conn, engine_kwargs="{{ params.engine_kwargs }}")
    op.engine_kwargs = {"max_model_len": 0}  # as a template renders it: a literal one fails as it is built

    with pytest.raises(Exception, match=r"max_model_len"):
        op.execute({"ti": supervisor.ti, "task_state_store": FakeStateStore()})
    links = finalize_links(op, supervisor.ti)

    assert links["Ray job"] == ""
    assert not ray_api.calls, "a refused spec reached the Ray cluster"
    assert error_lines() == [], f"finalizing the links logged at ERROR level (XComs read: {supervisor.reads})"
