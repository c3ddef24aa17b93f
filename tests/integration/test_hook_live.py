"""RayHook, RayJobTrigger and RayJobSensor against the real local Ray head with token auth on."""

from __future__ import annotations

import time
import uuid

import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.sensors.ray import RayJobSensor
from airflow_provider_raybatch.shared.exceptions import (
    RayAuthError,
    RayJobAlreadyExistsError,
    RayJobFailedError,
)
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from tests.conftest import cluster_ray_version

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _wait_terminal(hook: RayHook, job_id: str, timeout: float = 120) -> JobStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = hook.get_job_status(job_id)
        if status.is_terminal:
            return status
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {status} after {timeout} s")


def test_test_connection_reports_the_ray_version(ray_connection) -> None:
    ok, message = RayHook().test_connection()
    assert ok, message
    assert f"Ray {cluster_ray_version()}" in message


def test_wrong_token_is_rejected_with_a_clear_message(ray_cluster, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json(token="not-the-token"))
    with pytest.raises(RayAuthError, match="rejected the token") as raised:
        RayHook().list_jobs()
    assert "not-the-token" not in str(raised.value)
    ok, message = RayHook().test_connection()
    assert not ok and "rejected the token" in message


def test_submit_logs_metadata_and_duplicate_id(ray_connection) -> None:
    hook = RayHook()
    job_id = f"live-{uuid.uuid4().hex[:8]}"
    assert (
        hook.submit_job(
            "python -c \"print('hello raybatch')\"", submission_id=job_id, metadata={"airflow_dag_id": "d"}
        )
        == job_id
    )
    with pytest.raises(RayJobAlreadyExistsError):
        hook.submit_job("python -c 'pass'", submission_id=job_id)
    assert _wait_terminal(hook, job_id) == JobStatus.SUCCEEDED
    assert "hello raybatch" in hook.get_job_logs(job_id)
    listed = {info.job_id: info for info in hook.list_jobs()}
    assert listed[job_id].metadata["airflow_dag_id"] == "d"


def test_stop_job_and_the_trigger_reports_cancelled(ray_connection) -> None:
    hook = RayHook()
    job_id = hook.submit_job("sleep 120", submission_id=f"live-stop-{uuid.uuid4().hex[:8]}")
    while hook.get_job_status(job_id) == JobStatus.PENDING:
        time.sleep(0.5)
    assert hook.stop_job(job_id) is True
    assert _wait_terminal(hook, job_id) == JobStatus.STOPPED

    async def first_event():
        trigger = RayJobTrigger(job_id=job_id, poll_interval_seconds=0.2)
        return [event async for event in trigger.run()]

    import asyncio

    events = asyncio.run(first_event())
    assert [e.payload["status"] for e in events] == ["cancelled"]
    assert events[0].payload["termination_reason"] == "stopped"


async def test_trigger_waits_for_a_real_job_to_succeed(ray_connection) -> None:
    hook = RayHook()
    job_id = hook.submit_job("sleep 2", submission_id=f"live-trig-{uuid.uuid4().hex[:8]}")
    trigger = RayJobTrigger(job_id=job_id, poll_interval_seconds=0.5)
    events = [event async for event in trigger.run()]
    assert [e.payload for e in events] == [
        {
            "status": "success",
            "job_id": job_id,
            "message": f"Ray job {job_id} finished: SUCCEEDED. Job finished successfully.",
            "termination_reason": "succeeded",
        }
    ]


def test_sensor_pokes_a_failed_job_with_its_log_tail(ray_connection) -> None:
    hook = RayHook()
    job_id = hook.submit_job(
        "python -c \"import sys; print('about to fail'); sys.exit(3)\"",
        submission_id=f"live-sensor-{uuid.uuid4().hex[:8]}",
    )
    assert _wait_terminal(hook, job_id) == JobStatus.FAILED
    sensor = RayJobSensor(task_id="wait", job_id=job_id)
    with pytest.raises(RayJobFailedError, match="about to fail") as raised:
        sensor.poke(context={})
    assert raised.value.job_id == job_id and raised.value.status == "failed"


async def test_trigger_timeout_stops_a_real_job(ray_connection) -> None:
    """The deferral's time limit (execution_timeout while deferred) stops the job, not just the wait."""
    hook = RayHook()
    job_id = hook.submit_job("sleep 120", submission_id=f"live-timeout-{uuid.uuid4().hex[:8]}")
    trigger = RayJobTrigger(job_id=job_id, poll_interval_seconds=0.5, timeout_seconds=3)

    events = [event.payload async for event in trigger.run()]

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert "stopped it" in events[0]["message"]
    assert _wait_terminal(hook, job_id, timeout=60) == JobStatus.STOPPED


async def test_a_trigger_restarted_after_its_deadline_stops_the_real_job_at_once(ray_connection) -> None:
    """The deadline is absolute. A trigger the triggerer (re)starts after it,
    with a long poll interval, stops the job on its first look instead of waiting a new timeout."""
    hook = RayHook()
    job_id = hook.submit_job("sleep 120", submission_id=f"live-deadline-{uuid.uuid4().hex[:8]}")
    trigger = RayJobTrigger(
        job_id=job_id, poll_interval_seconds=600, timeout_seconds=600, deadline=time.time() - 1
    )

    started = time.monotonic()
    events = [event.payload async for event in trigger.run()]

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert time.monotonic() - started < 60
    assert _wait_terminal(hook, job_id, timeout=60) == JobStatus.STOPPED
