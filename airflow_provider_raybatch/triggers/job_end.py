"""Learn that a Ray job has ended within about a second, without polling faster.

A trigger or worker that polls every ``poll_interval_seconds`` (10 s by default) learns of a job's end
half an interval late on average, and a task's whole run took that much longer than its job
(bench/RESULTS.md, section 2: 9.2 of the 14.2 s an Airflow task added). Polling every second instead
would cost a triggerer waiting on 500 jobs 500 calls a second. So the waiter also follows the job's
log (:meth:`~airflow_provider_raybatch.hooks.ray.RayHook.a_follow_job_log`): the dashboard closes that
stream once the job is in a terminal state, checking once a second, and the waiter polls at once.

The polls stay what decides: the stream only wakes the waiter early. A stream that cannot be opened
(an old dashboard, a proxy that refuses websockets) or that breaks leaves plain polling, as before;
one that ends while the job still runs (a dashboard restart) is opened again, at most
:data:`MAX_STREAM_STARTS` times in all, so a dashboard that keeps closing it never makes the waiter
poll without a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from airflow_provider_raybatch.exceptions import RayHookError
from airflow_provider_raybatch.hooks.ray import RayHook

#: Most times one waiter opens the job's log stream (the first time included).
MAX_STREAM_STARTS = 3


class JobEndNotice:
    """Follows one job's log in the background and says when the stream has ended.

    :param hook: the hook the waiter polls with (its connection settings are reused).
    :param job_id: the job's submission id.
    :param log: the waiter's logger: one line when the stream cannot be followed.
    """

    def __init__(self, hook: RayHook, job_id: str, log: Any) -> None:  # Any: a logger.
        self.hook = hook
        self.job_id = job_id
        self.log = log
        self._ended = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._starts = 0
        self._given_up = False

    def _start(self) -> None:
        if self._given_up or self._starts >= MAX_STREAM_STARTS:
            return
        self._starts += 1
        self._ended.clear()
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        try:
            async for _chunk in self.hook.a_follow_job_log(self.job_id):
                pass  # the progress relay reads the log on its own schedule; here only the end counts
        except RayHookError as err:
            self._given_up = True
            self.log.info(
                "Not following the log of Ray job %s (%s); learning of its end by polling.", self.job_id, err
            )
            return
        self._ended.set()

    async def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the job's log stream ends first.

        Once a stream has ended and the waiter's poll still found the job running, the next wait opens
        a new one (up to :data:`MAX_STREAM_STARTS`); without one, this is a plain sleep.
        """
        if self._task is None or (self._task.done() and self._ended.is_set()):
            self._start()
        if self._task is None or self._task.done():
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), seconds)

    async def close(self) -> None:
        """Stop following the log (the waiter is done or cancelled)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
