"""Tests of airflow_provider_raybatch/sensors/ray.py: poke and the deferrable path, on a fake Ray API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import respx
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_raybatch.exceptions import RayJobFailedError, RayTriggerEventError
from airflow_provider_raybatch.sensors.ray import RayJobSensor
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from airflow_provider_raybatch.utils.events import job_event

JOB = "raysubmit_abc"
LOG = "".join(f"step {n}\n" for n in range(1, 61)) + "Traceback (most recent call last):\nValueError: boom\n"


@pytest.fixture
def sensor(ray_conn: str) -> RayJobSensor:
    return RayJobSensor(task_id="wait", job_id=JOB, ray_conn_id=ray_conn, poke_interval=7, timeout=300)


def test_template_fields() -> None:
    assert RayJobSensor.template_fields == ("job_id",)


def test_poke_succeeded_is_true(sensor: RayJobSensor, ray_api: respx.MockRouter, job_payload: Any) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "SUCCEEDED"))

    assert sensor.poke({}) is True


@pytest.mark.parametrize("status", ["PENDING", "RUNNING"])
def test_poke_unfinished_is_false(
    sensor: RayJobSensor, ray_api: respx.MockRouter, job_payload: Any, status: str
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, status))
    logs = ray_api.get(f"/api/jobs/{JOB}/logs").respond(json={"logs": LOG})

    assert sensor.poke({}) is False
    assert not logs.called


@pytest.mark.parametrize(("status", "reason"), [("FAILED", "failed"), ("STOPPED", "stopped")])
def test_poke_bad_ending_raises_with_the_log_tail(
    sensor: RayJobSensor, ray_api: respx.MockRouter, job_payload: Any, status: str, reason: str
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, status, message="exit code 1"))
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(json={"logs": LOG})

    with pytest.raises(RayJobFailedError) as info:
        sensor.poke({})

    message = str(info.value)
    assert message.startswith(f"Ray job {JOB} finished: {status}. exit code 1")
    assert message.endswith("Traceback (most recent call last):\nValueError: boom")
    assert "\nstep 22\n" not in message  # only the last 40 lines
    assert "\nstep 23\n" in message
    assert info.value.job_id == JOB
    assert info.value.status == reason


def test_poke_failed_without_a_log_still_raises(
    sensor: RayJobSensor, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "FAILED"))
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(500)

    with pytest.raises(RayJobFailedError) as info:
        sensor.poke({})

    assert str(info.value) == f"Ray job {JOB} finished: FAILED."


def test_deferrable_execute_defers_when_running(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "RUNNING"))
    sensor = RayJobSensor(
        task_id="wait", job_id=JOB, ray_conn_id=ray_conn, poke_interval=7, timeout=300, deferrable=True
    )

    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})

    trigger = info.value.trigger
    assert isinstance(trigger, RayJobTrigger)
    assert trigger.serialize()[1] == {
        "job_id": JOB,
        "ray_conn_id": ray_conn,
        "poll_interval_seconds": 7.0,
        "timeout_seconds": None,
        "retry_window_seconds": None,
        "progress_interval_seconds": 60.0,
    }
    assert info.value.method_name == "execute_complete"
    assert info.value.timeout == timedelta(seconds=300)


def test_deferrable_execute_returns_at_once_when_done(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "SUCCEEDED"))
    sensor = RayJobSensor(task_id="wait", job_id=JOB, ray_conn_id=ray_conn, deferrable=True)

    assert sensor.execute({}) is None


def test_execute_complete_success(sensor: RayJobSensor) -> None:
    assert sensor.execute_complete({}, job_event("success", JOB, "done", "succeeded")) is None


def test_execute_complete_error_raises_with_the_log_tail(
    sensor: RayJobSensor, ray_api: respx.MockRouter
) -> None:
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(json={"logs": LOG})

    with pytest.raises(RayJobFailedError) as info:
        sensor.execute_complete({}, job_event("error", JOB, "timed out", "timeout"))

    assert str(info.value).startswith("timed out\n")
    assert "ValueError: boom" in str(info.value)
    assert info.value.status == "timeout"


@pytest.mark.parametrize("event", [None, {"status": "success"}])
def test_execute_complete_rejects_malformed_events(sensor: RayJobSensor, event: Any) -> None:
    with pytest.raises(RayTriggerEventError):
        sensor.execute_complete({}, event)
