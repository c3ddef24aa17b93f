"""Tests of triggers/poll_pace.py: one status call a second per job while few wait, never a flood."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.triggers import poll_pace
from airflow_provider_raybatch.triggers.poll_pace import (
    CALLS_PER_SECOND,
    PACED_MAX_SECONDS,
    PACED_MIN_SECONDS,
    next_poll_in,
    paced_interval,
    waiters_here,
    waiting,
)
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from tests.unit.operators.test_llm_batch import make_operator


@pytest.mark.parametrize(
    ("waiters", "seconds"), [(0, 1.0), (1, 1.0), (50, 1.0), (100, 2.0), (500, 10.0), (5000, 10.0)]
)
def test_paced_interval(waiters: int, seconds: float) -> None:
    assert paced_interval(waiters) == seconds


@given(st.integers(min_value=0, max_value=10**9))
def test_pacing_is_bounded_and_never_floods_the_jobs_api(waiters: int) -> None:
    interval = paced_interval(waiters)

    assert PACED_MIN_SECONDS <= interval <= PACED_MAX_SECONDS
    # The process's status calls a second stay within the budget until the longest interval is reached.
    if waiters <= CALLS_PER_SECOND * PACED_MAX_SECONDS:
        assert waiters / interval <= CALLS_PER_SECOND + 1e-9
    assert paced_interval(waiters + 1) >= interval


def test_a_fixed_interval_is_kept() -> None:
    assert next_poll_in(7.5) == 7.5
    assert next_poll_in(None) == PACED_MIN_SECONDS


async def test_waiters_count_per_loop_and_leave_even_on_errors() -> None:
    assert waiters_here() == 0
    with waiting(), waiting():
        assert waiters_here() == 2
        assert await asyncio.to_thread(waiters_here) == 0  # another thread, no loop: the worker's count
    with pytest.raises(RuntimeError), waiting():
        raise RuntimeError("boom")
    assert waiters_here() == 0


async def test_triggers_sharing_a_loop_pace_each_other(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three triggers in one loop (a triggerer): each paces by three waiters; each sleeps what that says."""
    answers = iter(["RUNNING"] * 6 + ["SUCCEEDED"] * 3)
    ray_api.get("/api/jobs/j1").mock(
        side_effect=lambda _: httpx.Response(200, json=job_payload("j1", next(answers)))
    )
    seen: list[int] = []

    def record(waiters: int) -> float:
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
    assert waiters_here() == 0


def test_the_worker_polls_every_second_by_default(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_api.get("/api/jobs/j1").mock(
        side_effect=[
            httpx.Response(200, json=job_payload("j1", s)) for s in ("RUNNING", "RUNNING", "SUCCEEDED")
        ]
    )
    sleeps: list[float] = []
    monkeypatch.setattr(operator_module.time, "sleep", sleeps.append)

    event = make_operator(deferrable=False)._wait_in_worker(hook, "j1")

    assert event["status"] == "success"
    assert sleeps == [PACED_MIN_SECONDS, PACED_MIN_SECONDS]
