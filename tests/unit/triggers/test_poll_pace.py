"""Tests of triggers/poll_pace.py: one status call a second per job while few wait, never a flood."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.triggers import poll_pace
from airflow_provider_raybatch.triggers import ray as trigger_module
from airflow_provider_raybatch.triggers.poll_pace import (
    CALLS_PER_SECOND,
    PACED_MAX_SECONDS,
    PACED_MIN_SECONDS,
    load_here,
    next_poll_in,
    paced_interval,
    waiting,
)
from airflow_provider_raybatch.triggers.ray import RayJobTrigger, StatusLine
from tests.unit.operators.test_llm_batch import make_operator


@pytest.mark.parametrize(
    ("waiters", "seconds"), [(0, 1.0), (1, 1.0), (50, 1.0), (100, 2.0), (500, 10.0), (5000, 10.0)]
)
def test_paced_interval(waiters: int, seconds: float) -> None:
    assert paced_interval(waiters) == seconds


@given(st.integers(min_value=0, max_value=10**9), st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_pacing_is_bounded_and_never_floods_the_jobs_api(paced: int, fixed_rate: float) -> None:
    interval = paced_interval(paced, fixed_rate)

    assert PACED_MIN_SECONDS <= interval <= PACED_MAX_SECONDS
    # Paced and fixed waiters together stay within the budget until the longest interval is reached
    # (fixed waiters alone over budget leave the paced ones one call a second in all).
    if interval < PACED_MAX_SECONDS and fixed_rate <= CALLS_PER_SECOND - 1:
        assert paced / interval + fixed_rate <= CALLS_PER_SECOND + 1e-6
    assert paced_interval(paced + 1, fixed_rate) >= interval
    assert paced_interval(paced, fixed_rate + 1) >= interval


def test_sensors_polling_slowly_leave_room_for_the_paced() -> None:
    """450 sensors at poke_interval 60 make 7.5 calls a second: 50 paced operators still poll about
    every second, not every 10 s as a count of waiters would have it."""
    assert paced_interval(50, 450 / 60) == pytest.approx(50 / 42.5)


def test_a_fixed_interval_is_kept() -> None:
    assert next_poll_in(7.5) == 7.5
    assert next_poll_in(None) == PACED_MIN_SECONDS


async def test_waiters_count_per_loop_and_leave_even_on_errors() -> None:
    assert load_here() == (0, 0.0)
    with waiting(None), waiting(None), waiting(4.0):
        assert load_here() == (2, 0.25)
        assert await asyncio.to_thread(load_here) == (0, 0.0)  # another thread, no loop: the worker's
    with pytest.raises(RuntimeError), waiting(None):
        raise RuntimeError("boom")
    assert load_here() == (0, 0.0)


async def test_a_cancelled_trigger_leaves_the_count(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    trigger = RayJobTrigger(job_id="j1", ray_conn_id=ray_conn, progress_interval_seconds=0)

    async def run() -> None:
        async for _ in trigger.run():
            raise AssertionError("no event while the job runs")

    task = asyncio.ensure_future(run())
    await asyncio.sleep(0.3)
    assert load_here() == (1, 0.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert load_here() == (0, 0.0)


async def test_the_deadline_still_bounds_a_paced_sleep(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    ray_api.post("/api/jobs/j1/stop").respond(json={"stopped": True})
    monkeypatch.setattr(poll_pace, "paced_interval", lambda *_: 600.0)
    trigger = RayJobTrigger(
        job_id="j1", ray_conn_id=ray_conn, progress_interval_seconds=0, deadline=time.time() + 0.5
    )

    event = await asyncio.wait_for(anext(aiter(trigger.run())), 10)

    assert event.payload["termination_reason"] == "timeout"


async def test_triggers_sharing_a_loop_pace_each_other(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three triggers in one loop (a triggerer): each paces by three waiters; each sleeps what that says."""
    answers = iter(["RUNNING"] * 6 + ["SUCCEEDED"] * 3)
    ray_api.get("/api/jobs/j1").mock(
        side_effect=lambda _: httpx.Response(200, json=job_payload("j1", next(answers)))
    )
    seen: list[int] = []

    def record(waiters: int, fixed_calls_per_second: float) -> float:
        seen.append(waiters)
        return 0.01

    monkeypatch.setattr(poll_pace, "paced_interval", record)
    triggers = [
        RayJobTrigger(job_id="j1", ray_conn_id=ray_conn, progress_interval_seconds=0) for _ in range(3)
    ]

    async def first(trigger: RayJobTrigger) -> str:
        async for event in trigger.run():
            return event.payload["status"]
        raise AssertionError("no event")

    statuses = await asyncio.gather(*(first(t) for t in triggers))

    assert statuses == ["success"] * 3
    assert seen and max(seen) == 3
    assert load_here() == (0, 0.0)


def test_the_worker_polls_every_second_by_default(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").mock(
        side_effect=[
            httpx.Response(200, json=job_payload("j1", s)) for s in ("RUNNING", "RUNNING", "SUCCEEDED")
        ]
    )
    sleeps: list[tuple[float, tuple[int, float]]] = []
    monkeypatch.setattr(operator_module.time, "sleep", lambda seconds: sleeps.append((seconds, load_here())))

    event = make_operator(deferrable=False)._wait_in_worker(hook, "j1")

    assert event["status"] == "success"
    assert sleeps == [(PACED_MIN_SECONDS, (1, 0.0))] * 2  # counted in while it waits
    assert load_here() == (0, 0.0)  # and out after


def test_workers_in_one_process_pace_each_other(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads of one process waiting without a loop share the budget: with 149 others waiting, the
    worker polls every 3 s."""
    ray_api.get("/api/jobs/j1").mock(
        side_effect=[httpx.Response(200, json=job_payload("j1", s)) for s in ("RUNNING", "SUCCEEDED")]
    )
    sleeps: list[float] = []
    monkeypatch.setattr(operator_module.time, "sleep", sleeps.append)
    with contextlib.ExitStack() as others:
        for _ in range(149):
            others.enter_context(waiting(None))
        make_operator(deferrable=False)._wait_in_worker(hook, "j1")

    assert sleeps == [3.0]


def test_a_fixed_interval_worker_sleeps_it(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").mock(
        side_effect=[httpx.Response(200, json=job_payload("j1", s)) for s in ("RUNNING", "SUCCEEDED")]
    )
    sleeps: list[float] = []
    monkeypatch.setattr(operator_module.time, "sleep", sleeps.append)

    make_operator(deferrable=False, poll_interval_seconds=7)._wait_in_worker(hook, "j1")

    assert sleeps == [7]


def test_the_state_is_logged_when_it_changes_not_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    log = type("Log", (), {"info": lambda self, msg, *args: lines.append(msg % args)})()
    now = iter([0.0, 1.0, 2.0, 3.0, 70.0, 71.0])
    monkeypatch.setattr(trigger_module.time, "monotonic", lambda: next(now))
    status_line = StatusLine("j1", log)

    for status in ("PENDING", "RUNNING", "RUNNING", "RUNNING", "RUNNING", "RUNNING"):
        status_line.show(JobStatus(status))

    assert lines == [
        "Ray job j1 is PENDING.",
        "Ray job j1 is RUNNING.",
        "Ray job j1 is RUNNING.",
    ]  # at 0, 1, 70 s
