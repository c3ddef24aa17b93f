"""Tests of airflow_provider_raybatch/triggers/ray.py: one event per wait, from a fake Ray Jobs API."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import airflow
import httpx
import pytest
import respx
from packaging.version import Version

import airflow_provider_raybatch.hooks.ray as ray_hook_module
from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus
from airflow_provider_raybatch.triggers import ray as trigger_module
from airflow_provider_raybatch.triggers.ray import DEFER_SETTLE_SECONDS, RayJobTrigger, event_for_job
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
        "owns_job": True,
        "deadline": None,
        "fire_not_before": None,
    }
    assert rebuilt.serialize() == trigger.serialize()


async def test_an_event_of_a_job_already_over_waits_for_the_deferral_to_settle(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that ended as the task deferred (a retry attached to a job its earlier try's cleanup then
    stopped): the event waits until fire_not_before, so that Airflow takes note of the deferral first
    (apache/airflow#72716); never longer than the settle time, whatever the value."""
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "STOPPED"))
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(trigger_module.asyncio, "sleep", sleep)
    now = time.time()

    for fire_not_before, held in [
        (now + 4, 4),
        (now + 3600, DEFER_SETTLE_SECONDS),
        (now - 5, None),
        (None, None),
    ]:
        slept.clear()
        events = await events_of(make_trigger(fire_not_before=fire_not_before))
        assert [e["termination_reason"] for e in events] == ["stopped"]
        if held is None:
            assert slept == []
        else:
            assert slept and held - 1 < slept[-1] <= held


def test_serialize_round_trip_with_a_deadline() -> None:
    _, kwargs = RayJobTrigger(job_id=JOB, deadline=1_790_000_000.5).serialize()

    assert kwargs["deadline"] == 1_790_000_000.5
    assert RayJobTrigger(**kwargs).serialize()[1] == kwargs


def test_serialize_round_trip_of_a_watching_trigger() -> None:
    _, kwargs = RayJobTrigger(job_id=JOB, owns_job=False).serialize()

    assert kwargs["owns_job"] is False
    assert RayJobTrigger(**kwargs).owns_job is False


#: What RayJobTrigger.serialize() returned before ``owns_job`` existed (the operator's and the sensor's
#: triggers alike): such rows may be in the triggerer's table during an upgrade.
OLD_SERIALIZED_KWARGS = {
    "job_id": JOB,
    "ray_conn_id": "ray_default",
    "poll_interval_seconds": 10.0,
    "timeout_seconds": 600.0,
    "retry_window_seconds": None,
    "progress_interval_seconds": 60.0,
}


async def test_a_trigger_serialized_before_owns_job_loads_and_still_stops_on_kill(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    rebuilt = RayJobTrigger(**{**OLD_SERIALIZED_KWARGS, "ray_conn_id": ray_conn})
    await rebuilt.on_kill()

    assert rebuilt.owns_job is True
    assert rebuilt.serialize()[1] == {
        **OLD_SERIALIZED_KWARGS,
        "ray_conn_id": ray_conn,
        "owns_job": True,
        "deadline": None,
        "fire_not_before": None,
    }
    assert stop.call_count == 1


@pytest.mark.parametrize("value", ["false", 0, None])
def test_owns_job_must_be_a_bool(value: Any) -> None:
    with pytest.raises(TypeError, match="owns_job="):
        RayJobTrigger(job_id=JOB, owns_job=value)


def test_serialize_without_timeout() -> None:
    _, kwargs = RayJobTrigger(job_id=JOB).serialize()

    assert kwargs["timeout_seconds"] is None
    assert kwargs["ray_conn_id"] == "ray_default"
    assert kwargs["poll_interval_seconds"] is None  # paced (triggers/poll_pace.py)
    assert RayJobTrigger(**kwargs).poll_interval_seconds is None


@pytest.mark.parametrize("interval", [0, -1, 0.0, float("nan")])
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
        status_answers(job_payload, "RUNNING")
        + outage
        + status_answers(job_payload, "RUNNING")
        + outage
        + status_answers(job_payload, "SUCCEEDED")
    )
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


async def test_timeout_seconds_counts_from_the_first_run_on_the_wall_clock(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger serialized before ``deadline`` existed: a fake clock, 100 s a reading; the 150 s
    timeout passes by the 2nd poll, and one last look finds the job still running before the stop."""
    clock = itertools.count(0, 100)
    monkeypatch.setattr(
        trigger_module, "time", SimpleNamespace(time=lambda: float(next(clock)), monotonic=time.monotonic)
    )
    polls = ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await events_of(make_trigger(timeout_seconds=150))

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert polls.call_count == 2  # one poll, then the last look at the deadline
    assert stop.call_count == 1
    assert "within 150 s" in events[0]["message"]


async def test_terminal_state_wins_over_an_expired_deadline(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that succeeded just before the deadline is a success, not a timeout."""
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "SUCCEEDED"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": False})

    events = await events_of(make_trigger(deadline=time.time() - 5))

    assert [e["status"] for e in events] == ["success"]
    assert not stop.called


# -- one absolute deadline, checked before every wait -----------------------------------------------


async def test_a_deadline_that_passed_while_the_triggerer_was_down_stops_the_job_at_once(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    """Restarted after the deadline: a trigger that counted its timeout from its own start would wait
    a full timeout more (and Airflow's deferral timeout would kill it first, leaving the job running)."""
    polls = ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await events_of(
        make_trigger(deadline=time.time() - 1, timeout_seconds=3600, poll_interval_seconds=600)
    )

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert polls.call_count == 1 and stop.call_count == 1
    assert events[0]["message"].endswith("stopped it.")


async def test_a_long_poll_interval_never_sleeps_past_the_deadline(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    started = time.monotonic()
    events = await asyncio.wait_for(
        events_of(make_trigger(deadline=time.time() + 0.5, poll_interval_seconds=3600)), timeout=20
    )

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert time.monotonic() - started < 15  # woke at the deadline, not after the hour's poll interval
    assert stop.call_count == 1


async def test_a_poll_hanging_in_its_retry_window_is_cut_at_the_deadline(
    make_trigger: Any, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Jobs API hangs (a head restarting behind a proxy): the poll is cut at the deadline and the
    stop is still asked for, itself bounded, so the event fires in time whatever the API does."""

    async def hangs(self: Any, job_id: str) -> JobInfo:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    monkeypatch.setattr(ray_hook_module.RayHook, "a_get_job_info", hangs)
    monkeypatch.setattr(trigger_module, "STOP_CALL_SECONDS", 0.5)
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await asyncio.wait_for(events_of(make_trigger(deadline=time.time() + 0.5)), timeout=20)

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert stop.call_count == 1


async def test_a_crash_in_the_trigger_is_an_error_event_not_a_silent_end(
    make_trigger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an event Airflow fails the task and no execute_complete stops the job."""

    async def crashes(self: Any, job_id: str) -> JobInfo:
        raise RuntimeError("unexpected payload shape")

    monkeypatch.setattr(ray_hook_module.RayHook, "a_get_job_info", crashes)

    events = await events_of(make_trigger())

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "trigger_error")]
    assert "RuntimeError: unexpected payload shape" in events[0]["message"]


async def test_on_kill_stops_the_job(make_trigger: Any, ray_api: respx.MockRouter) -> None:
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    await make_trigger().on_kill()

    assert stop.call_count == 1


async def test_on_kill_cancelled_while_it_stops_the_job_still_stops_it(
    make_trigger: Any, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load, Airflow cancelled on_kill again while its stop call was on the way,
    swallowed the CancelledError, and the job ran on. The stop must outlive on_kill's cancellation."""
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})
    real_stop = ray_hook_module.RayHook.a_stop_job

    async def slow_stop(self: Any, job_id: str) -> bool:
        await asyncio.sleep(0.3)  # the connection lookup and the call take a while
        return await real_stop(self, job_id)

    monkeypatch.setattr(ray_hook_module.RayHook, "a_stop_job", slow_stop)

    killing = asyncio.ensure_future(make_trigger().on_kill())
    await asyncio.sleep(0.05)
    killing.cancel()  # what the triggerer's second cancel does
    with pytest.raises(asyncio.CancelledError):
        await killing
    for _ in range(100):
        if stop.called:
            break
        await asyncio.sleep(0.05)

    assert stop.call_count == 1


async def test_on_kill_of_a_watching_trigger_leaves_the_job_running(
    make_trigger: Any, ray_api: respx.MockRouter
) -> None:
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    await make_trigger(owns_job=False).on_kill()

    assert not stop.called


async def test_timeout_of_a_watching_trigger_leaves_the_job_running(
    make_trigger: Any, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    events = await events_of(make_trigger(timeout_seconds=0.05, owns_job=False))

    assert [(e["status"], e["termination_reason"]) for e in events] == [("error", "timeout")]
    assert events[0]["message"].endswith("; left it running (this task only watches it).")
    assert not stop.called


# -- cancellation through Airflow's own triggerer code --------------------------------------------


async def cancel_in_the_triggerer(trigger: RayJobTrigger, polls: respx.Route, *, user_action: bool) -> None:
    """Run ``trigger`` in Airflow's TriggerRunner until it has polled, then cancel it as the triggerer does.

    ``user_action``: the task was marked failed or success, or cleared (``cancel_triggers``, which
    calls ``on_kill``); otherwise the triggerer is shutting down and cancels the task bare.
    """
    from airflow.jobs import triggerer_job_runner

    runner = triggerer_job_runner.TriggerRunner()
    task = asyncio.create_task(runner.run_trigger(1, trigger))
    runner.triggers[1] = {"task": task, "is_watcher": False, "name": "ray_job_trigger", "events": 0}
    for _ in range(500):
        if polls.called:
            break
        await asyncio.sleep(0.01)
    assert polls.called, "the trigger never polled"
    if user_action:
        runner.to_cancel.append(1)
        await runner.cancel_triggers()
    else:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.events == deque()  # cancelled: no event reached the task


#: Airflow's triggerer calls a trigger's ``on_kill`` on a user action from 3.3.0 on; 3.2 only cancels
#: the trigger, so there a task marked failed leaves its job running (README, "Versions we test").
TRIGGERER_CALLS_ON_KILL = Version(airflow.__version__) >= Version("3.3.0")


@pytest.mark.parametrize(
    ("owns_job", "user_action", "stops"),
    [
        (
            True,
            True,
            int(TRIGGERER_CALLS_ON_KILL),
        ),  # the operator's trigger: marking its task failed stops its job
        (False, True, 0),  # the sensor's trigger only watches
        (True, False, 0),  # a triggerer restart never stops a job
        (False, False, 0),
    ],
    ids=["owner-killed", "watcher-killed", "owner-triggerer-restart", "watcher-triggerer-restart"],
)
async def test_cancel_in_the_triggerer_stops_only_an_owned_job_and_only_on_user_action(
    make_trigger: Any,
    ray_api: respx.MockRouter,
    job_payload: Any,
    monkeypatch: pytest.MonkeyPatch,
    owns_job: bool,
    user_action: bool,
    stops: int,
) -> None:
    monkeypatch.setenv("AIRFLOW_DISABLE_GREENBACK_PORTAL", "true")
    polls = ray_api.get(JOB_PATH).respond(json=job_payload(JOB, "RUNNING"))
    stop = ray_api.post(STOP_PATH).respond(json={"stopped": True})

    await cancel_in_the_triggerer(make_trigger(owns_job=owns_job), polls, user_action=user_action)

    assert stop.call_count == stops
