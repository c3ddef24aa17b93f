"""Tests of airflow_provider_raybatch/sensors/ray.py: poke and the deferrable path, on a fake Ray API."""

from __future__ import annotations

import importlib
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
import respx
from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

from airflow_provider_raybatch.sensors.ray import RayJobSensor
from airflow_provider_raybatch.shared.exceptions import RayHookError, RayJobFailedError, RayTriggerEventError
from airflow_provider_raybatch.triggers import ray as trigger_module
from airflow_provider_raybatch.triggers.ray import DEFER_SETTLE_SECONDS, RayJobTrigger
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
    kwargs = trigger.serialize()[1]
    # The event waits for the deferral to settle (triggers/ray.py DEFER_SETTLE_SECONDS).
    assert time.time() < kwargs.pop("fire_not_before") <= time.time() + DEFER_SETTLE_SECONDS
    assert kwargs == {
        "job_id": JOB,
        "ray_conn_id": ray_conn,
        "poll_interval_seconds": 7.0,
        "timeout_seconds": None,
        "retry_window_seconds": None,
        "progress_interval_seconds": 60.0,
        "owns_job": False,
        "deadline": None,
    }
    assert info.value.method_name == "execute_complete"
    assert info.value.timeout == timedelta(seconds=300)


def test_deferred_without_a_poke_interval_polls_at_the_operator_s_pace(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "RUNNING"))
    sensor = RayJobSensor(task_id="wait", job_id=JOB, ray_conn_id=ray_conn, deferrable=True)

    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})

    # None: the paced default (1 s while few jobs wait), not Airflow's 60 s poke_interval.
    assert sensor.poke_interval == 60
    assert info.value.trigger.serialize()[1]["poll_interval_seconds"] is None


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

    assert str(info.value).startswith("timed out. Why: ValueError: boom\n")  # the driver's last error first
    assert "ValueError: boom" in str(info.value)
    assert info.value.status == "timeout"


@pytest.mark.parametrize("event", [None, {"status": "success"}])
def test_execute_complete_rejects_malformed_events(sensor: RayJobSensor, event: Any) -> None:
    with pytest.raises(RayTriggerEventError):
        sensor.execute_complete({}, event)


# -- the sensor only watches ------------------------------------------------------------------------


def rebuilt_in_the_triggerer(deferral: TaskDeferred) -> RayJobTrigger:
    """The trigger as the triggerer loads it: from its serialized form."""
    classpath, kwargs = deferral.trigger.serialize()
    module_name, _, class_name = classpath.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


async def test_killing_the_deferred_sensor_leaves_the_job_running(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    """Marking the deferred sensor failed or success, or clearing it, runs its trigger's on_kill."""
    ray_api.get(f"/api/jobs/{JOB}").respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(f"/api/jobs/{JOB}/stop").respond(json={"stopped": True})
    sensor = RayJobSensor(task_id="wait", job_id=JOB, ray_conn_id=ray_conn, deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})

    await rebuilt_in_the_triggerer(info.value).on_kill()

    assert not stop.called


# -- soft_fail and never_fail mean the same in every mode --------------------------------------------


MODES = ["poke", "deferrable-at-once", "deferrable-after-the-wait"]


async def run_sensor(
    sensor: RayJobSensor, mode: str, ray_api: respx.MockRouter, final: httpx.Response
) -> None:
    """Run ``sensor`` as Airflow would until the job's status answers ``final``.

    poke: ``execute`` with the poke loop; deferrable-at-once: the job has ended before the sensor starts;
    deferrable-after-the-wait: the sensor defers, its trigger sees ``final`` and Airflow resumes the sensor
    with the event through ``resume_execution`` (which is where Airflow applies its own soft_fail logic).
    """
    status = ray_api.get(f"/api/jobs/{JOB}")
    if mode != "deferrable-after-the-wait":
        status.mock(return_value=final)
        sensor.execute({})
        return
    status.respond(json={"submission_id": JOB, "status": "RUNNING"})  # the fields the hook reads
    with pytest.MonkeyPatch.context() as patch:
        # The event is held 0.05 s after the deferral, not 10 s: these tests are about soft_fail and
        # never_fail; the hold itself is tests/unit/triggers/test_ray.py's.
        patch.setattr(trigger_module, "DEFER_SETTLE_SECONDS", 0.05)
        with pytest.raises(TaskDeferred) as info:
            sensor.execute({})
        status.mock(return_value=final)
        events = [event.payload async for event in rebuilt_in_the_triggerer(info.value).run()]
    assert len(events) == 1
    sensor.resume_execution(info.value.method_name, {"event": events[0]}, {})


def make_sensor(ray_conn: str, mode: str, **flags: bool) -> RayJobSensor:
    return RayJobSensor(
        task_id="wait",
        job_id=JOB,
        ray_conn_id=ray_conn,
        poke_interval=0.01,
        timeout=30,
        deferrable=mode != "poke",
        **flags,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flag", ["soft_fail", "never_fail"])
@pytest.mark.parametrize("status", ["FAILED", "STOPPED"])
async def test_a_job_that_ended_badly_skips_with_soft_fail_or_never_fail(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, mode: str, flag: str, status: str
) -> None:
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(json={"logs": LOG})
    stop = ray_api.post(f"/api/jobs/{JOB}/stop").respond(json={"stopped": True})
    final = httpx.Response(200, json=job_payload(JOB, status, message="exit code 1"))

    with pytest.raises(AirflowSkipException, match=flag):
        await run_sensor(make_sensor(ray_conn, mode, **{flag: True}), mode, ray_api, final)

    assert not stop.called


@pytest.mark.parametrize("mode", MODES)
async def test_a_job_that_ended_badly_fails_without_the_flags(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, mode: str
) -> None:
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(json={"logs": LOG})
    final = httpx.Response(200, json=job_payload(JOB, "FAILED", message="exit code 1"))

    with pytest.raises(RayJobFailedError) as info:
        await run_sensor(make_sensor(ray_conn, mode), mode, ray_api, final)

    assert info.value.status == "failed"
    assert "ValueError: boom" in str(info.value)


@pytest.mark.parametrize("mode", MODES)
async def test_an_api_error_skips_with_never_fail(
    ray_conn: str, ray_api: respx.MockRouter, mode: str
) -> None:
    with pytest.raises(AirflowSkipException, match="never_fail"):
        await run_sensor(make_sensor(ray_conn, mode, never_fail=True), mode, ray_api, httpx.Response(404))


@pytest.mark.parametrize("mode", MODES)
async def test_an_api_error_still_fails_with_soft_fail(
    ray_conn: str, ray_api: respx.MockRouter, mode: str
) -> None:
    """soft_fail skips what the sensor decides (a bad ending, the timeout), as Airflow's poke loop does."""
    ray_api.get(f"/api/jobs/{JOB}/logs").respond(404)

    with pytest.raises((RayHookError, RayJobFailedError), match="404"):
        await run_sensor(make_sensor(ray_conn, mode, soft_fail=True), mode, ray_api, httpx.Response(404))


@pytest.mark.parametrize("flag", ["soft_fail", "never_fail"])
def test_the_deferral_timeout_skips_with_soft_fail_or_never_fail(ray_conn: str, flag: str) -> None:
    """The sensor's ``timeout`` passing while deferred, as the task runner reports it."""
    sensor = make_sensor(ray_conn, "deferrable", **{flag: True})

    with pytest.raises(AirflowSkipException, match=flag):
        sensor.resume_execution(TRIGGER_FAIL_REPR, {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, {})


def test_a_malformed_event_skips_with_never_fail(ray_conn: str) -> None:
    sensor = make_sensor(ray_conn, "deferrable", never_fail=True)

    with pytest.raises(AirflowSkipException, match="never_fail"):
        sensor.resume_execution("execute_complete", {"event": None}, {})
