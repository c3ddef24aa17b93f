"""Where a run's wall time and GPUs went: the manifest's ``timings`` block.

A user who backfills a month wants to see what a run cost and what start-up took of it (issue 20):
the driver marks the moments it knows (rows ready, engine stage started and done, committed), and the
staged parts' ``written_at`` give when the engines' first and last rows were staged. GPU-seconds count
what the job held, not what it used: replicas x GPUs per replica x the seconds from the engine stage's
start to its end (engines are reserved for all of it, start-up included).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_raybatch.pipeline.reporting.report import epoch_seconds


@dataclass
class RunClock:
    """Wall-clock marks (epoch seconds) of one run, taken by the driver as it goes."""

    started: float = field(default_factory=time.time)
    rows_ready: float | None = None  # read, prepared, repeated ids found: the rows the engine gets are known
    engine_started: float | None = None  # the engine stage's dataset starts (engines requested)
    engine_done: float | None = None  # every batch through the engines and staged
    committed: float | None = None  # the version's files and report written (manifest next)

    def mark(self, name: str) -> None:
        setattr(self, name, time.time())


def first_and_last_written(sidecars: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Earliest and latest ``written_at`` of these parts' sidecars (epoch seconds), None without any."""
    times = [t for t in (epoch_seconds(s.get("written_at")) for s in sidecars) if t is not None]
    return (min(times), max(times)) if times else (None, None)


def _seconds(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(end - start, 0.0), 3)


def run_timings(
    clock: RunClock,
    engine_parts: Iterable[Mapping[str, Any]],  # Any: JSON sidecar values.
    replicas: int,
    gpus_per_replica: float,
) -> dict[str, Any]:  # Any: JSON values.
    """The ``timings`` block: each phase in seconds (None where the run had no such phase) and GPU-seconds.

    ``read_and_prepare_s``: start to rows ready. ``engine_start_to_first_row_s``: the engine stage's
    start to its first staged row (engine build, compile, first batch; engines built while the rows
    were read started earlier). ``generating_s``: first to last staged row of the engines.
    ``commit_s``: engines done to the version written. ``gpu_seconds_held``: ``replicas`` x
    ``gpus_per_replica`` x the engine stage's seconds, 0 on a CPU engine, None without an engine.
    """
    first, last = first_and_last_written(engine_parts)
    engine_s = _seconds(clock.engine_started, clock.engine_done)
    return {
        "read_and_prepare_s": _seconds(clock.started, clock.rows_ready),
        "engine_start_to_first_row_s": _seconds(clock.engine_started, first),
        "generating_s": _seconds(first, last),
        "engine_stage_s": engine_s,
        "commit_s": _seconds(clock.engine_done or clock.rows_ready, clock.committed),
        "replicas": replicas if engine_s is not None else 0,
        "gpus_per_replica": gpus_per_replica,
        "gpu_seconds_held": None if engine_s is None else round(replicas * gpus_per_replica * engine_s, 1),
    }
