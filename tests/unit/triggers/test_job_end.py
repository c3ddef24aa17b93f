"""Tests of triggers/job_end.py: a waiter learns of a job's end from its log stream, not a poll later.

A real aiohttp server plays the dashboard: ``GET /api/jobs/{id}`` answers the job's status and
``/api/jobs/{id}/logs/tail`` is a websocket that, as Ray's, sends the log and closes once the job has
ended. respx (tests/unit/conftest.py) cannot speak websockets, so these tests do not use it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from airflow_provider_raybatch.hooks.ray import RayConnectionSettings, RayHook
from airflow_provider_raybatch.triggers import job_end
from airflow_provider_raybatch.triggers.job_end import MAX_STREAM_STARTS, JobEndNotice
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from tests.unit.operators.test_llm_batch import make_operator

TOKEN = "stream-t0ken"
JOB = "raybatch-dag-task-run-m-1-t1-abc"
#: Far longer than any wait here should take: a waiter that only polled would take this long.
LONG_POLL_SECONDS = 30.0


@dataclass
class FakeDashboard:
    """What the fake dashboard does with log streams, and what it saw."""

    stream: str = "follow"  # "follow": as Ray's; "refuse": HTTP 404; "drop": close at once
    status: str = "RUNNING"
    ended_at: float | None = None
    polls: int = 0
    streams: int = 0
    stream_paths: list[str] = field(default_factory=list)
    stream_auth: list[str | None] = field(default_factory=list)

    def end(self, status: str = "SUCCEEDED") -> None:
        self.status = status
        self.ended_at = time.monotonic()

    async def job(self, request: web.Request) -> web.Response:
        self.polls += 1
        return web.json_response(
            {
                "type": "SUBMISSION",
                "job_id": None,
                "submission_id": request.match_info["job_id"],
                "status": self.status,
                "entrypoint": "python -m airflow_provider_raybatch.pipeline",
                "message": "",
                "metadata": {},
                "start_time": 1_700_000_000_000,
                "end_time": None,
            }
        )

    async def tail(self, request: web.Request) -> web.StreamResponse:
        self.streams += 1
        self.stream_paths.append(request.raw_path)
        self.stream_auth.append(request.headers.get("Authorization"))
        if self.stream == "refuse":
            return web.Response(status=404, text="no log streams here")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("2026-11-26 10:00:00\tINFO starting\n")
        if self.stream == "follow":
            while self.status in ("PENDING", "RUNNING") and not ws.closed:
                if request.transport is None or request.transport.is_closing():
                    return ws  # the client left
                await asyncio.sleep(0.05)
            await ws.send_str("done\n")
        await ws.close()
        return ws


@pytest.fixture
async def dashboard() -> AsyncIterator[tuple[FakeDashboard, RayHook]]:
    fake = FakeDashboard()
    app = web.Application()
    app.router.add_get("/api/jobs/{job_id}", fake.job)
    app.router.add_get("/api/jobs/{job_id}/logs/tail", fake.tail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    hook = RayHook(ray_conn_id="unused")
    hook._settings = RayConnectionSettings(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        cookies={},
        verify=True,
        timeout_seconds=5.0,
        retry_window_seconds=0,
    )
    try:
        yield fake, hook
    finally:
        await runner.cleanup()


def trigger_on(hook: RayHook, **kwargs: Any) -> RayJobTrigger:  # Any: constructor arguments.
    arguments = {"poll_interval_seconds": LONG_POLL_SECONDS, "progress_interval_seconds": 0, **kwargs}
    trigger = RayJobTrigger(job_id=JOB, ray_conn_id="unused", **arguments)
    trigger._hook = lambda: hook  # type: ignore[method-assign]
    return trigger


async def first_event(trigger: RayJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger fired no event")


async def test_the_trigger_fires_about_a_second_after_the_job_ends_not_a_poll_later(
    dashboard: tuple[FakeDashboard, RayHook],
) -> None:
    fake, hook = dashboard
    waiting = asyncio.ensure_future(first_event(trigger_on(hook)))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    fake.end()

    event = await asyncio.wait_for(waiting, LONG_POLL_SECONDS / 3)

    assert event["status"] == "success"
    assert fake.ended_at is not None and time.monotonic() - fake.ended_at < 5
    assert fake.polls == 2  # one before the end, one when the stream closed: no faster polling
    assert fake.streams == 1
    assert fake.stream_auth == [f"Bearer {TOKEN}"]


async def test_a_failed_job_is_noticed_as_soon(dashboard: tuple[FakeDashboard, RayHook]) -> None:
    fake, hook = dashboard
    waiting = asyncio.ensure_future(first_event(trigger_on(hook)))
    await asyncio.sleep(0.3)
    fake.end("FAILED")

    event = await asyncio.wait_for(waiting, LONG_POLL_SECONDS / 3)

    assert (event["status"], event["termination_reason"]) == ("error", "failed")


async def test_a_dashboard_that_refuses_streams_leaves_plain_polling(
    dashboard: tuple[FakeDashboard, RayHook],
) -> None:
    fake, hook = dashboard
    fake.stream = "refuse"
    waiting = asyncio.ensure_future(first_event(trigger_on(hook, poll_interval_seconds=0.5)))
    await asyncio.sleep(1.2)
    fake.end()

    event = await asyncio.wait_for(waiting, 5)

    assert event["status"] == "success"
    assert fake.streams == 1, "a refused stream is not asked for again"
    assert 2 <= fake.polls <= 6


async def test_streams_that_close_while_the_job_runs_never_make_the_waiter_spin(
    dashboard: tuple[FakeDashboard, RayHook],
) -> None:
    fake, hook = dashboard
    fake.stream = "drop"
    waiting = asyncio.ensure_future(first_event(trigger_on(hook, poll_interval_seconds=0.5)))
    await asyncio.sleep(2.0)
    fake.end()

    event = await asyncio.wait_for(waiting, 5)

    assert event["status"] == "success"
    assert fake.streams == MAX_STREAM_STARTS
    # One poll per dropped stream (at once) plus one per interval: bounded, never a busy loop.
    assert fake.polls <= MAX_STREAM_STARTS + 2.5 / 0.5 + 2


async def test_a_hostile_job_id_stays_one_path_segment_of_the_stream(
    dashboard: tuple[FakeDashboard, RayHook],
) -> None:
    fake, hook = dashboard
    fake.end()
    chunks = [chunk async for chunk in hook.a_follow_job_log("../../api/jobs/other?x=1#y")]

    assert chunks == ["2026-11-26 10:00:00\tINFO starting\n", "done\n"]
    assert fake.stream_paths == ["/api/jobs/..%2F..%2Fapi%2Fjobs%2Fother%3Fx%3D1%23y/logs/tail"]


async def test_the_notice_is_closed_with_its_waiter(dashboard: tuple[FakeDashboard, RayHook]) -> None:
    fake, hook = dashboard
    notice = JobEndNotice(hook, JOB, job_end_logger())
    await notice.wait(0.3)  # starts following; the job runs on
    assert notice._task is not None and not notice._task.done()

    await notice.close()

    assert notice._task.done()


def job_end_logger() -> Any:  # Any: a logger.
    import logging

    return logging.getLogger(job_end.__name__)


async def test_the_worker_learns_of_the_end_as_the_trigger_does(
    dashboard: tuple[FakeDashboard, RayHook],
) -> None:
    """Worker mode (``deferrable=False``) waits the same way, under its own event loop (a thread
    here, since the fake dashboard runs in this test's loop)."""
    fake, hook = dashboard
    op = make_operator(deferrable=False, poll_interval_seconds=LONG_POLL_SECONDS)
    waiting = asyncio.ensure_future(asyncio.to_thread(op._wait_in_worker, hook, JOB))
    await asyncio.sleep(0.5)
    fake.end()

    event = await asyncio.wait_for(waiting, LONG_POLL_SECONDS / 3)

    assert event["status"] == "success"
    assert fake.streams == 1
