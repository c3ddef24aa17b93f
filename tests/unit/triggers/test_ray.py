"""Tests of airflow_provider_raybatch/triggers/ray.py: one event per wait, from a fake Ray Jobs API."""

from __future__ import annotations

import importlib
import itertools
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import respx

import airflow_provider_raybatch.hooks.ray as ray_hook_module
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus
from airflow_provider_raybatch.triggers import ray as trigger_module
from airflow_provider_raybatch.triggers.ray import RayJobTrigger, event_for_job
from airflow_provider_raybatch.utils.events import EVENT_KEYS

JOB = "raybatch-dag-task-run-m-1-t1-abc"
JOB_PATH = f"/api/jobs/{JOB}"
STOP_PATH = f"{JOB_PATH}/stop"


@pytest.fixture
def make_trigger(ray_conn: str) -> Any:
    def make(**kwargs: Any) -> RayJobTrigger:  # Any: constructor arguments.
        return RayJobTrigger(
            **{
                "job_id": JOB,
                "ray_conn_id": ray_conn,
                "poll_interval_seconds": 0.01,
                "progress_interval_seconds": 0,  # no driver-log fetches unless a test asks
                **kwargs,
            }
        )

    return make


def status_answers(job_payload: Any, *statuses: str, **extra: Any) -> list[httpx.Response]:
    return [httpx.Response(200, json=job_payload(JOB, status, **extra)) for status in statuses]


async def events_of(trigger: RayJobTrigger) -> list[dict[str, Any]]:
    return [event.payload async for event in trigger.run()]


# -- construction and serialization -------------------------------------------------------------


def test_serialize_round_trip() -> None:
    trigger = RayJobTrigger(job_id=JOB, ray_conn_id="ray_x", poll_interval_seconds=5, timeout_seconds=600)

    classpath, kwargs = trigger.serialize()
    module_name, _, class_name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module_name), class_name)(**kwargs)

    assert classpath == "airflow_provider_raybatch.triggers.ray.RayJobTrigger"
    assert kwargs == {
        "job_id": JOB,
        "ray_conn_id": "ray_x",
        "poll_interval_seconds": 5.0,
        "timeout_seconds": 600.0,
        "retry_window_seconds": None,
        "progress_interval_seconds": 60.0,
    }
    assert rebuilt.serialize() == trigger.serialize()


def test_serialize_without_timeout() -> None:
    _, kwargs = RayJobTrigger(job_id=JOB).serialize()

    assert kwargs["timeout_seconds"] is None
    assert kwargs["ray_conn_id"] == "ray_default"
    assert kwargs["poll_interval_seconds"] == 10.0


@pytest.mark.parametrize("interval", [0, -1, 0.0])
def test_non_positive_poll_interval_raises(interval: float) -> None:
    with pytest.raises(ValueError, match="poll_interval_seconds"):
        RayJobTrigger(job_id=JOB, poll_interval_seconds=interval)


@pytest.mark.parametrize(
    ("status", "event_status", "reason"),
    [
        ("SUCCEEDED", "success", "succeeded"),
        ("STOPPED", "cancelled", "stopped"),
        ("FAILED", "error", "failed"),
    ],
)
def test_event_for_job(status: str, event_status: str, reason: str) -> None:
    event = event_for_job(JobInfo(job_id="j", status=JobStatus(status), message="Exit code 1."))

    assert event == {
        "status": event_status,
        "job_id": "j",
        "message": f"Ray job j finished: {status}. Exit code 1.",
        "termination_reason": reason,
    }


# -- run ----------------------------------------------------------------------------------------


async def test_success_after_running(make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any) -> None:
    route = ray_api.get(JOB_PATH).mock(
        side_effect=status_answers(job_payload, "PENDING", "RUNNING", "SUCCEEDED")
    )

    events = await events_of(make_trigger())

    assert events == [
        {
            "status": "success",
            "job_id": JOB,
            "message": f"Ray job {JOB} finished: SUCCEEDED.",
            "termination_reason": "succeeded",
        }
    ]
    assert tuple(events[0]) == EVENT_KEYS
    assert route.call_count == 3


@pytest.mark.parametrize(
    ("status", "event_status", "reason"), [("STOPPED", "cancelled", "stopped"), ("FAILED", "error", "failed")]
)
async def test_bad_endings(
    make_trigger: Any,
    ray_api: respx.MockRouter,
    job_payload: Any,
    status: str,
    event_status: str,
    reason: str,
) -> None:
    ray_api.get(JOB_PATH).mock(
        side_effect=status_answers(job_payload, "RUNNING")
        + status_answers(job_payload, status, message="Job entrypoint command failed with exit code 1")
    )
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": False})

    events = await events_of(make_trigger())

    assert events == [
        {
            "status": event_status,
            "job_id": JOB,
            "message": f"Ray job {JOB} finished: {status}. Job entrypoint command failed with exit code 1",
            "termination_reason": reason,
        }
    ]
    assert not stop.called


@pytest.mark.parametrize(
    ("response", "fragment"),
    [(httpx.Response(404, text="Job does not exist"), "404"), (httpx.Response(401), "token")],
    ids=["not-found", "unauthorized"],
)
async def test_not_found_or_unauthorized_is_an_api_error_at_once(
    make_trigger: Any, ray_api: respx.MockRouter, response: httpx.Response, fragment: str
) -> None:
    route = ray_api.get(JOB_PATH).mock(return_value=response)

    events = await events_of(make_trigger())

    assert len(events) == 1
    assert tuple(events[0]) == EVENT_KEYS
    assert events[0]["status"] == "error"
    assert events[0]["termination_reason"] == "api_error"
    assert events[0]["job_id"] == JOB
    assert fragment in events[0]["message"]
    assert route.call_count == 1


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_hook_module, "FIRST_RETRY_WAIT_SECONDS", 0.01)
    monkeypatch.setattr(ray_hook_module, "MAX_RETRY_WAIT_SECONDS", 0.02)


async def test_transient_errors_are_retried_within_the_window(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, fast_retries: None
) -> None:
    flaky: list[Any] = [httpx.Response(503, text="head restarting"), httpx.ConnectError("refused")] * 3
    route = ray_api.get(JOB_PATH).mock(side_effect=flaky + status_answers(job_payload, "SUCCEEDED"))

    events = await events_of(make_trigger(retry_window_seconds=30))

    assert [e["status"] for e in events] == ["success"]
    assert route.call_count == len(flaky) + 1


async def test_outage_between_good_polls_is_ridden_out(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, fast_retries: None
) -> None:
    outage: list[Any] = [httpx.ConnectError("refused")] * 4
    answers = (
        status_answers(job_payload, "RUNNING") + outage + status_answers(job_payload, "RUNNING") + outage
        + status_answers(job_payload, "SUCCEEDED")
    )  # fmt: skip
    ray_api.get(JOB_PATH).mock(side_effect=answers)

    events = await events_of(make_trigger(retry_window_seconds=30))

    assert [e["status"] for e in events] == ["success"]


async def test_outage_longer_than_the_window_gives_up(
    make_trigger: Any, ray_api: respx.MockRouter, fast_retries: None
) -> None:
    route = ray_api.get(JOB_PATH).mock(return_value=httpx.Response(502, text="bad gateway"))

    events = await events_of(make_trigger(retry_window_seconds=0.3))

    assert len(events) == 1
    assert events[0]["status"] == "error"
    assert events[0]["termination_reason"] == "api_error"
    assert "502" in events[0]["message"]
    assert route.call_count > 2  # retried, then gave up once the window closed


async def test_window_zero_fails_on_the_first_error(make_trigger: Any, ray_api: respx.MockRouter) -> None:
    route = ray_api.get(JOB_PATH).mock(return_value=httpx.Response(503, text="unavailable"))

    events = await events_of(make_trigger(retry_window_seconds=0))

    assert [e["termination_reason"] for e in events] == ["api_error"]
    assert route.call_count == 1


async def test_timeout_stops_the_job(make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any) -> None:
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await events_of(make_trigger(timeout_seconds=0.05))

    assert len(events) == 1
    assert tuple(events[0]) == EVENT_KEYS
    assert events[0]["status"] == "error"
    assert events[0]["termination_reason"] == "timeout"
    assert "stopped it" in events[0]["message"]
    assert stop.call_count == 1


async def test_timeout_is_measured_with_monotonic(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake clock, 100 s a reading: the 150 s deadline passes at the 2nd poll, whatever the wall clock."""
    clock = itertools.count(0, 100)
    # Only monotonic is offered: reading time.time() would raise AttributeError.
    monkeypatch.setattr(trigger_module, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    polls = ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await events_of(make_trigger(timeout_seconds=150))

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert polls.call_count == 2
    assert stop.call_count == 1
    assert "within 150 s" in events[0]["message"]


async def test_terminal_state_wins_over_an_expired_deadline(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = itertools.count(0, 1000)
    monkeypatch.setattr(trigger_module, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "SUCCEEDED"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": False})

    events = await events_of(make_trigger(timeout_seconds=1))

    assert [e["status"] for e in events] == ["success"]
    assert not stop.called


async def test_on_kill_stops_the_job(make_trigger: Any, ray_api: respx.MockRouter) -> None:
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    await make_trigger().on_kill()

    assert stop.call_count == 1
