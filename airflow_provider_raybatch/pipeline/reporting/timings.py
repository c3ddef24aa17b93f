"""Where a run's wall time and GPUs went: the manifest's ``timings`` block.

A user who backfills a month wants to see what a run cost and what start-up took of it (issue 20):
the driver marks the moments it knows (rows ready, engine stage started and done, committed), the
Jobs API's record and the driver's process say when the job was submitted and when its driver
started (the runtime env between), each engine replica stamps its own start on the parts it stages
(:func:`replica_clock`) and when an engine took its first row (:data:`FIRST_ROW_IN_ENGINE_KEY`), and
the staged parts' ``written_at`` give when the engines' last rows were staged. GPU-seconds count what
the job held, not what it used: replicas x GPUs per replica x the seconds from the engine stage's start
to its end (engines are reserved for all of it, start-up included).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_raybatch.pipeline.reporting.report import epoch_seconds
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

log = logging.getLogger(__name__)

#: A staged part's sidecar key for the clock of the engine replica that staged it (:func:`replica_clock`).
REPLICA_KEY = "replica"
#: A staged part's sidecar key: when an engine took the first row of the stage that staged it (epoch
#: seconds; generate/staged_udf.py), where start-up ends and generating begins.
FIRST_ROW_IN_ENGINE_KEY = "first_row_in_engine_at"


@dataclass
class RunClock:
    """Wall-clock marks (epoch seconds) of one run, taken by the driver as it goes."""

    started: float = field(default_factory=time.time)
    rows_ready: float | None = None  # read, prepared, repeated ids found: the rows the engine gets are known
    engine_started: float | None = None  # the engine stage's dataset starts (engines requested)
    engine_done: float | None = None  # every batch through the engines and staged
    committed: float | None = None  # the version's files and report written (manifest next)
    submitted: float | None = None  # the Jobs API took the job (its JobInfo start_time)
    driver_started: float | None = None  # the driver's process started (its runtime env was ready)

    def mark(self, name: str) -> None:
        setattr(self, name, time.time())


def job_submitted_at(submission_id: str | None) -> float | None:
    """When the Jobs API took this job (epoch seconds, the head's clock), or None when unknown.

    The job's record in the GCS (what ``GET /api/jobs/<id>`` shows as ``start_time``): read here, at the
    end of the run, so that a layout change in a Ray release costs a missing phase, never the job.
    """
    if not submission_id:
        return None
    try:
        from ray._private import ray_constants
        from ray.dashboard.modules.job.common import JobInfoStorageClient
        from ray.experimental.internal_kv import _internal_kv_get

        key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id)
        record = _internal_kv_get(key, namespace=ray_constants.KV_NAMESPACE_JOB)
    except Exception:  # noqa: BLE001 - a report's detail; see the docstring
        log.debug("No submit time for job %s.", submission_id, exc_info=True)
        return None
    return submitted_at_of(record)


def submitted_at_of(record: JsonValue) -> float | None:
    """A job record's ``start_time`` (JSON, milliseconds) in epoch seconds; None for anything else."""
    try:
        start_ms = json.loads(record).get("start_time") if record else None
    except (ValueError, TypeError, AttributeError):
        return None
    if isinstance(start_ms, int | float) and not isinstance(start_ms, bool) and 0 < start_ms < 1e15:
        return start_ms / 1000
    return None


def process_started_at() -> float | None:
    """When this process started (epoch seconds), or None: for the driver, the end of its runtime env."""
    try:
        import psutil  # type: ignore[import-untyped]  # Ray's own dependency; no stubs here

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - a report's detail
        return None


def replica_clock(loaded_at: float, init_started_at: float, engine_ready_at: float) -> dict[str, Any]:
    """An engine replica's own marks, stamped on each part it stages (``sidecar["replica"]``).

    :param loaded_at: its stage module was imported (the actor's process is up, its runtime env ready).
    :param init_started_at: its constructor began (Ray Data LLM's stage module imported, the actor made).
    :param engine_ready_at: its constructor ended: vLLM imported, the engine built (weights loaded,
        compiled, CUDA graphs captured).
    """
    return {
        "id": uuid.uuid4().hex[:12],
        "loaded_at": round(loaded_at, 3),
        "init_started_at": round(init_started_at, 3),
        "engine_ready_at": round(engine_ready_at, 3),
    }


def replica_phases(
    engine_parts: Iterable[Mapping[str, JsonValue]], engine_started: float | None
) -> list[JsonObject]:
    """Each engine replica's start-up, in seconds, from the clocks on the parts it staged, by first ready.

    ``actor_start_s``: the engine stage's start to the replica's module loaded (the actor scheduled, its
    worker process and runtime env). ``import_s``: to its constructor (Ray Data LLM's stage module).
    ``engine_build_s``: the constructor (vLLM imported, the engine built: weights, compile, CUDA graphs;
    vLLM's own log splits these). ``first_row_s``: engine ready to its engine taking its first row
    (:func:`generating_from`). Parts without a clock (a warm pool's replicas, an older job's) count none.
    """
    clocks: dict[str, Mapping[str, Any]] = {}
    parts_of: dict[str, list[Mapping[str, Any]]] = {}
    for sidecar in engine_parts:
        clock = sidecar.get(REPLICA_KEY)
        if not isinstance(clock, Mapping) or not isinstance(clock.get("id"), str):
            continue
        clocks.setdefault(clock["id"], clock)
        parts_of.setdefault(clock["id"], []).append(sidecar)
    first_written = {replica: generating_from(parts) for replica, parts in parts_of.items()}
    phases = [
        {
            "replica": replica,
            "actor_start_s": _seconds(engine_started, _mark(clock, "loaded_at")),
            "import_s": _seconds(_mark(clock, "loaded_at"), _mark(clock, "init_started_at")),
            "engine_build_s": _seconds(_mark(clock, "init_started_at"), _mark(clock, "engine_ready_at")),
            "first_row_s": _seconds(_mark(clock, "engine_ready_at"), first_written.get(replica)),
        }
        for replica, clock in clocks.items()
    ]
    return sorted(phases, key=lambda phase: _mark(clocks[phase["replica"]], "engine_ready_at") or 0.0)


def _built_for_this_job(pool: Mapping[str, JsonValue] | None) -> float | None:
    """The slowest engine build of a warm pool's replicas that started after the job asked for them."""
    builds = [
        build
        for entry in (pool or {}).get("replica_timings") or []
        if isinstance(entry, Mapping)
        and (start := _mark(entry, "engine_start_s")) is not None
        and start >= 0
        and (build := _mark(entry, "engine_build_seconds")) is not None
    ]
    return max(builds) if builds else None


def _mark(clock: Mapping[str, JsonValue], key: str) -> float | None:
    value = clock.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _slowest(phases: list[JsonObject], key: str) -> float | None:
    values = [phase[key] for phase in phases if phase.get(key) is not None]
    return max(values) if values else None


def first_and_last_written(sidecars: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Earliest and latest ``written_at`` of these parts' sidecars (epoch seconds), None without any."""
    times = [t for t in (epoch_seconds(s.get("written_at")) for s in sidecars) if t is not None]
    return (min(times), max(times)) if times else (None, None)


def generating_from(sidecars: Iterable[Mapping[str, JsonValue]]) -> float | None:
    """When the engines took their first row (epoch seconds): the end of start-up, the start of generating.

    The earliest :data:`FIRST_ROW_IN_ENGINE_KEY` of the parts; for parts without it (an older job's),
    their first ``written_at``, which counts the first batch's generation as start-up.
    """
    sidecars = list(sidecars)
    taken = [stamp for sidecar in sidecars if (stamp := _mark(sidecar, FIRST_ROW_IN_ENGINE_KEY)) is not None]
    return min(taken) if taken else first_and_last_written(sidecars)[0]


def _seconds(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(end - start, 0.0), 3)


def run_timings(
    clock: RunClock,
    engine_parts: Iterable[Mapping[str, JsonValue]],
    replicas: int,
    gpus_per_replica: float,
    keep_warm_seconds: float | None = None,
    lease_started: float | None = None,
    pool: Mapping[str, JsonValue] | None = None,
) -> JsonObject:
    """The ``timings`` block: each phase in seconds (None where the run had no such phase) and GPU-seconds.

    ``job_wall_s``: submitted to committed (to now, before the commit): the whole job as Ray times it,
    runtime env and driver start included, which the manifest's ``wall_seconds`` (the driver's run
    only) leaves out. ``runtime_env_s``: submitted to the driver's process started (the job's runtime
    env: packages uploaded by the operator are unpacked, a ``pip`` list installed). ``driver_start_s``:
    to the run's start (Python, our imports, ``ray.init``). ``read_and_prepare_s``: start to rows ready.
    ``engine_start_to_first_row_s``: the engine stage's start (after the reads) to an engine taking its
    first row (:func:`generating_from`): what the rows waited for the engines (the build, compile; a
    warm pool's answer). A replica built beside the reads (a warm pool's cold replica) started before
    this phase: its own ``engine_build_s`` and the pool's ``engine_ready_s`` (counted from the job's
    lease, taken while it reads) can be longer than it. ``generating_s``: from there to the engines'
    last staged row, in which they staged ``rows_generated`` rows (this try's engine parts: none an
    earlier try staged; a batch retried whole counts each time it went through an engine).
    ``commit_s``: engines done to the version written. Between them, so that one after
    the other they account for ``job_wall_s`` (else 10.6 s of a 46.2 s job were in none):
    ``before_engine_stage_s``, rows ready to the engine stage's start (the bad rows staged, the
    processor's build awaited), and ``engine_stage_end_s``, the last row staged to the stage's end. The
    engines' own start-up (``engine_build_s``, ``engine_replicas``) overlaps the phases before it.

    ``replica_seconds_held``: ``replicas`` x the engine stage's seconds, None without an engine; on a
    warm pool from the job's lease (``lease_started``, when it asked for its replicas, beside the reads)
    if that was sooner (a cold pool job holds its replica through its build: counted from the stage, one
    that waited out a 45 s build showed 43.8 replica-seconds); and ``gpu_seconds_held``: that x
    ``gpus_per_replica`` (0 on a CPU engine).
    ``keep_warm_gpu_seconds_max``:
    on a warm pool, what its replicas may hold after the job, idle, waiting for the next one (replicas
    x GPUs x ``keep_warm_seconds``, at most: a next job ends the wait); the pool's, not counted in
    ``gpu_seconds_held``; ``keep_warm_replica_seconds_max`` the same without the GPUs (a CPU engine's
    idle replicas hold memory too). ``engine_replicas``: each replica's own start-up (:func:`replica_phases`);
    ``engine_import_s`` and ``engine_build_s``: the slowest replica's; on a warm pool, whose replicas
    stamp no parts, ``engine_build_s`` is the slowest build of the replicas started for this job
    (``pool``'s ``replica_timings``; import included), None when every replica was warm.
    """
    engine_parts = list(engine_parts)
    first, last = generating_from(engine_parts), first_and_last_written(engine_parts)[1]
    engine_s = _seconds(clock.engine_started, clock.engine_done)
    phases = replica_phases(engine_parts, clock.engine_started)
    held_from = min(clock.engine_started, lease_started) if clock.engine_started and lease_started else None
    held_s = engine_s if held_from is None else _seconds(held_from, clock.engine_done)
    replica_seconds = None if held_s is None else round(replicas * held_s, 1)
    kept_warm = kept_warm_replicas = None
    if keep_warm_seconds and engine_s is not None:
        kept_warm = round(replicas * gpus_per_replica * keep_warm_seconds, 1)
        kept_warm_replicas = round(replicas * keep_warm_seconds, 1)
    return {
        "job_wall_s": _seconds(clock.submitted, clock.committed or time.time()),
        "runtime_env_s": _seconds(clock.submitted, clock.driver_started),
        "driver_start_s": _seconds(clock.driver_started, clock.started),
        "read_and_prepare_s": _seconds(clock.started, clock.rows_ready),
        "before_engine_stage_s": _seconds(clock.rows_ready, clock.engine_started),
        "engine_start_to_first_row_s": _seconds(clock.engine_started, first),
        "engine_import_s": _slowest(phases, "import_s"),
        "engine_build_s": _slowest(phases, "engine_build_s") or _built_for_this_job(pool),
        "generating_s": _seconds(first, last),
        "rows_generated": sum(len(sidecar.get("sources") or ()) for sidecar in engine_parts),
        "engine_stage_end_s": _seconds(last, clock.engine_done),
        "engine_stage_s": engine_s,
        "commit_s": _seconds(clock.engine_done or clock.rows_ready, clock.committed),
        "replicas": replicas if engine_s is not None else 0,
        "gpus_per_replica": gpus_per_replica,
        "replica_seconds_held": replica_seconds,
        "gpu_seconds_held": None if held_s is None else round(replicas * gpus_per_replica * held_s, 1),
        "keep_warm_gpu_seconds_max": kept_warm,
        "keep_warm_replica_seconds_max": kept_warm_replicas,
        "engine_replicas": phases,
    }
