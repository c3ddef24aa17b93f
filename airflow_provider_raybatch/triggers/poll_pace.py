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

A waiter counts itself in while it waits (:func:`waiting`); the count is per event loop (a
triggerer's triggers share one). Waiters at a fixed interval (a sensor's ``poke_interval``) count by
the calls they make. The budget is per process: a worker (``deferrable=False``) waits on its one job
and polls every second, so hundreds of worker-mode tasks at once make hundreds of calls a second;
deferrable tasks share their triggerer's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

#: The shortest paced interval: a job's end is known within about this long.
PACED_MIN_SECONDS = 1.0
#: The longest paced interval, reached when a process waits on PACED_MAX_SECONDS x CALLS_PER_SECOND jobs
#: (past that, more calls than CALLS_PER_SECOND: a job's end is never learned later than this).
PACED_MAX_SECONDS = 10.0
#: Status calls a second one process may make when pacing: 500 jobs at 10 s, the triggerer load
#: bench/RESULTS.md section 3 measured (7-9% of a core in the triggerer, 8-10% in the dashboard).
CALLS_PER_SECOND = 50.0


@dataclass
class _Load:
    """The waiters of one event loop (or of a worker's sync waits): paced ones, and the status calls a
    second the fixed-interval ones make (a sensor's ``poke_interval``, a number the DAG set)."""

    paced: int = 0
    fixed_calls_per_second: float = 0.0


#: Per event loop; the worker's sync wait counts outside any loop. The lock keeps threads' counts whole.
_LOADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Load] = weakref.WeakKeyDictionary()
_LOAD_WITHOUT_LOOP = _Load()
_LOCK = threading.Lock()


def _load_here() -> _Load:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _LOAD_WITHOUT_LOOP
    return _LOADS.setdefault(loop, _Load())


def load_here() -> tuple[int, float]:
    """(paced waiters, fixed-interval calls a second) on this event loop, or outside any."""
    load = _load_here()
    return load.paced, load.fixed_calls_per_second


@contextlib.contextmanager
def waiting(poll_interval_seconds: float | None) -> Iterator[None]:
    """Count one waiter in for the duration of its wait: paced (None), or at a fixed interval."""
    load = _load_here()
    with _LOCK:
        if poll_interval_seconds is None:
            load.paced += 1
        else:
            load.fixed_calls_per_second += 1 / poll_interval_seconds
    try:
        yield
    finally:
        with _LOCK:
            if poll_interval_seconds is None:
                load.paced -= 1
            else:
                load.fixed_calls_per_second = max(
                    load.fixed_calls_per_second - 1 / poll_interval_seconds, 0.0
                )


def paced_interval(paced_waiters: int, fixed_calls_per_second: float = 0.0) -> float:
    """Seconds between two status calls of one paced waiter: the paced waiters share what the
    fixed-interval ones leave of :data:`CALLS_PER_SECOND` (at least one call a second), each polling
    every :data:`PACED_MIN_SECONDS` to :data:`PACED_MAX_SECONDS`."""
    room = max(CALLS_PER_SECOND - fixed_calls_per_second, 1.0)
    return min(PACED_MAX_SECONDS, max(PACED_MIN_SECONDS, paced_waiters / room))


def next_poll_in(poll_interval_seconds: float | None) -> float:
    """The wait before the next status call: the user's fixed interval, or the paced one (None)."""
    if poll_interval_seconds is not None:
        return poll_interval_seconds
    return paced_interval(*load_here())
