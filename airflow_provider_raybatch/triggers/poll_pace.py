"""How often to ask a Ray job's status: every second while a process waits on few jobs, slower under load.

A fixed 10 s poll learns of a job's end 5 s late on average and up to 10 s late (bench/RESULTS.md,
section 2: 9.2 of the 14.2 s an Airflow task added to its job). Polling every second would cost a
triggerer waiting on 500 jobs 500 Jobs API calls a second. So the interval is paced by the number of
jobs this process waits on at once: one call a second per job while that stays within
:data:`CALLS_PER_SECOND` calls a second for the whole process, then longer intervals, up to
:data:`PACED_MAX_SECONDS` (the old fixed interval, whose load section 3 measured at 500 jobs).

Why not follow the job's log stream (``/api/jobs/{id}/logs/tail``), which the dashboard closes once a
job ends? Ray 2.60's dashboard proxies every stream to its JobHead module through one aiohttp
``UnixConnector`` of 100 connections, so ~100 open streams starve JobHead's health check and the
dashboard restarts it, failing every Jobs API call (tried with 500 triggers: bench/RESULTS.md 8a).

A waiter counts itself in while it waits (:meth:`PollPace.waiting`); the count is per event loop (a
triggerer's triggers share one; a worker waits on its one job).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterator

#: The shortest paced interval: a job's end is known within about this long.
PACED_MIN_SECONDS = 1.0
#: The longest paced interval, reached when a process waits on PACED_MAX_SECONDS x CALLS_PER_SECOND jobs.
PACED_MAX_SECONDS = 10.0
#: Status calls a second one process may make when pacing: 500 jobs at 10 s, the triggerer load
#: bench/RESULTS.md section 3 measured (7-9% of a core in the triggerer, 8-10% in the dashboard).
CALLS_PER_SECOND = 50.0

#: Waiters per event loop (None: the worker's sync wait, outside any loop).
_WAITING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()
_WAITING_WITHOUT_LOOP = 0


def _loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def waiters_here() -> int:
    """How many waiters count themselves in on this event loop (or outside any, in a worker)."""
    loop = _loop()
    return _WAITING_WITHOUT_LOOP if loop is None else _WAITING.get(loop, 0)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Count one waiter in for the duration of its wait."""
    global _WAITING_WITHOUT_LOOP
    loop = _loop()
    if loop is None:
        _WAITING_WITHOUT_LOOP += 1
    else:
        _WAITING[loop] = _WAITING.get(loop, 0) + 1
    try:
        yield
    finally:
        if loop is None:
            _WAITING_WITHOUT_LOOP -= 1
        else:
            _WAITING[loop] -= 1


def paced_interval(waiters: int) -> float:
    """Seconds between two status calls of one waiter when ``waiters`` wait in the same process."""
    return min(PACED_MAX_SECONDS, max(PACED_MIN_SECONDS, waiters / CALLS_PER_SECOND))


def next_poll_in(poll_interval_seconds: float | None) -> float:
    """The wait before the next status call: the user's fixed interval, or the paced one (None)."""
    if poll_interval_seconds is not None:
        return poll_interval_seconds
    return paced_interval(waiters_here())
