"""Tests of pipeline/reporting/timings.py: the manifest's account of where the time and GPUs went."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.reporting.timings import (
    FIRST_ROW_IN_ENGINE_KEY,
    REPLICA_KEY,
    RunClock,
    first_and_last_written,
    job_submitted_at,
    process_started_at,
    replica_clock,
    replica_phases,
    run_timings,
    submitted_at_of,
)

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC).timestamp()
#: The phases that follow each other from the job's submission to its commit.
SEQUENTIAL_PHASES = (
    "runtime_env_s",
    "driver_start_s",
    "read_and_prepare_s",
    "before_engine_stage_s",
    "engine_start_to_first_row_s",
    "generating_s",
    "engine_stage_end_s",
    "commit_s",
)


def sidecar(at: float, replica: object = None) -> dict[str, object]:
    written_at = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    part: dict[str, object] = {"written_at": written_at}
    if replica is not None:
        part[REPLICA_KEY] = replica
    return part


def test_a_run_with_an_engine() -> None:
    clock = RunClock(
        started=T0,
        rows_ready=T0 + 12,
        engine_started=T0 + 13,
        engine_done=T0 + 100,
        committed=T0 + 101.5,
        submitted=T0 - 9,
        driver_started=T0 - 4,
    )
    parts = [sidecar(T0 + 60), sidecar(T0 + 99), sidecar(T0 + 45)]

    timings = run_timings(clock, parts, replicas=4, gpus_per_replica=0.25)

    assert timings == {
        "job_wall_s": 110.5,  # submitted to committed: runtime env and driver start included
        "runtime_env_s": 5.0,
        "driver_start_s": 4.0,
        "read_and_prepare_s": 12.0,
        "before_engine_stage_s": 1.0,
        "engine_start_to_first_row_s": 32.0,
        "engine_import_s": None,  # no replica stamped its clock (a warm pool's, an older job's)
        "engine_build_s": None,
        "generating_s": 54.0,
        "rows_generated": 0,  # these parts list no sources
        "engine_stage_end_s": 1.0,
        "engine_stage_s": 87.0,
        "commit_s": 1.5,
        "replicas": 4,
        "gpus_per_replica": 0.25,
        "replica_seconds_held": 348.0,  # 4 x 87 s, on a CPU engine too
        "gpu_seconds_held": 87.0,  # 4 x 0.25 GPU x 87 s
        "keep_warm_gpu_seconds_max": None,  # no warm pool
        "keep_warm_replica_seconds_max": None,
        "engine_replicas": [],
    }
    # One after the other the phases make up the job (else 10.6 s of a 46.2 s job were in none).
    assert sum(timings[phase] for phase in SEQUENTIAL_PHASES) == pytest.approx(timings["job_wall_s"])
    # On a warm pool, what its replicas may hold idle after the job, the pool's, apart from the job's.
    pooled = run_timings(clock, parts, replicas=4, gpus_per_replica=0.25, keep_warm_seconds=600)
    assert pooled["keep_warm_gpu_seconds_max"] == 600.0 and pooled["gpu_seconds_held"] == 87.0
    assert pooled["keep_warm_replica_seconds_max"] == 2400.0  # 4 replicas x 600 s, whatever they hold


def test_a_cold_pool_job_counts_its_replicas_build_and_holds_them_from_its_lease() -> None:
    """A job whose pool replica was built for it showed no engine build in its timings and
    held fewer replica-seconds (43.8) than the build it waited for (45.2 s)."""
    clock = RunClock(
        started=T0,
        rows_ready=T0 + 12,
        engine_started=T0 + 13,
        engine_done=T0 + 60,
        committed=T0 + 61,
        submitted=T0 - 9,
        driver_started=T0 - 4,
    )
    pool = {
        "warm_replicas": 1,
        "replica_timings": [
            {"replica": 0, "engine_start_s": -300.0, "engine_build_seconds": 80.0},  # warm: built earlier
            {"replica": 1, "engine_start_s": 0.4, "engine_build_seconds": 45.2},  # started for this job
            {"replica": 2, "engine_start_s": 0.6, "engine_build_seconds": None},  # still building at the end
        ],
    }

    cold = run_timings(
        clock,
        [sidecar(T0 + 59)],
        replicas=3,
        gpus_per_replica=1.0,
        keep_warm_seconds=60,
        lease_started=T0 + 1,
        pool=pool,
    )

    assert cold["engine_build_s"] == 45.2
    assert cold["engine_import_s"] is None  # a replica's import is inside its build: not split
    assert cold["engine_stage_s"] == 47.0
    assert cold["replica_seconds_held"] == 177.0  # 3 x 59 s, from the lease (beside the reads)
    assert cold["gpu_seconds_held"] == 177.0
    assert sum(cold[phase] for phase in SEQUENTIAL_PHASES) == pytest.approx(cold["job_wall_s"])
    warm = run_timings(
        clock,
        [sidecar(T0 + 59)],
        replicas=3,
        gpus_per_replica=1.0,
        keep_warm_seconds=60,
        lease_started=T0 + 1,
        pool={"replica_timings": pool["replica_timings"][:1]},
    )
    assert warm["engine_build_s"] is None  # every replica warm: this job built nothing


def test_generating_starts_when_an_engine_takes_its_first_row() -> None:
    """Every row in one batch, so the first staged part came with the last and
    ``generating_s`` read 0.007 s, the whole decode counted as start-up. The engines' first row taken
    (stamped by the stage on its parts) is where start-up ends."""
    clock = RunClock(started=T0, rows_ready=T0 + 2, engine_started=T0 + 3, engine_done=T0 + 60)
    ready = replica_clock(loaded_at=T0 + 4, init_started_at=T0 + 5, engine_ready_at=T0 + 30)
    one_batch = [
        {**sidecar(T0 + 59.99, ready), FIRST_ROW_IN_ENGINE_KEY: T0 + 31},
        {**sidecar(T0 + 59.993, ready), FIRST_ROW_IN_ENGINE_KEY: T0 + 31},
    ]

    timings = run_timings(clock, one_batch, replicas=1, gpus_per_replica=0.0)

    assert (timings["engine_start_to_first_row_s"], timings["generating_s"]) == (28.0, 28.993)
    [replica] = timings["engine_replicas"]
    assert replica["first_row_s"] == 1.0  # engine ready to its first row taken, not to its first part
    # An older job's parts, without the stamp: their first part, as before.
    assert run_timings(clock, [sidecar(T0 + 59.99, ready)], 1, 0.0)["generating_s"] == 0.0


def test_before_the_commit_the_job_s_time_runs_to_now() -> None:
    """The report is written during the commit: its job time runs to the page, not to the end."""
    clock = RunClock(started=T0, rows_ready=T0 + 1, submitted=T0 - 9)

    before = datetime.now(UTC).timestamp() - T0 + 9
    job_wall = run_timings(clock, [], replicas=1, gpus_per_replica=1.0)["job_wall_s"]
    assert before - 0.001 <= job_wall <= datetime.now(UTC).timestamp() - T0 + 9 + 0.001  # rounded to ms
    assert run_timings(RunClock(started=T0), [], 1, 1.0)["job_wall_s"] is None  # submit time unknown


def test_each_replica_s_start_up_comes_from_the_clock_on_its_parts() -> None:
    slow = replica_clock(loaded_at=T0 + 20, init_started_at=T0 + 21, engine_ready_at=T0 + 50)
    fast = replica_clock(loaded_at=T0 + 15, init_started_at=T0 + 15.5, engine_ready_at=T0 + 40)
    assert slow["id"] != fast["id"]
    parts = [
        sidecar(T0 + 70, slow),
        sidecar(T0 + 52, slow),  # its first part
        sidecar(T0 + 44, fast),
        sidecar(T0 + 90, fast),
        sidecar(T0 + 60),  # a part without a clock counts for no replica
        sidecar(T0 + 61, {"id": 7}),  # nor one with a clock that is not ours
    ]
    clock = RunClock(started=T0, rows_ready=T0 + 5, engine_started=T0 + 10, engine_done=T0 + 95)

    timings = run_timings(clock, parts, replicas=2, gpus_per_replica=1.0)

    keys = ("actor_start_s", "import_s", "engine_build_s", "first_row_s")
    assert timings["engine_replicas"] == [  # by engine ready
        {"replica": fast["id"], **dict(zip(keys, (5.0, 0.5, 24.5, 4.0), strict=True))},
        {"replica": slow["id"], **dict(zip(keys, (10.0, 1.0, 29.0, 2.0), strict=True))},
    ]
    assert (timings["engine_import_s"], timings["engine_build_s"]) == (1.0, 29.0)  # the slowest replica's
    assert timings["engine_start_to_first_row_s"] == 34.0


def test_the_job_s_start_is_none_where_ray_cannot_say() -> None:
    assert job_submitted_at(None) is None and job_submitted_at("") is None
    # Outside a Ray job (no ray.init here): no record to read, and no exception either.
    assert job_submitted_at("raysubmit_hostile/../../x") is None
    started = process_started_at()
    assert started is None or started <= datetime.now(UTC).timestamp()


def test_a_corrupt_job_record_costs_the_phase_not_the_run() -> None:
    for record in (
        None,
        b"",
        b"{not json",
        b'{"start_time": "soon"}',
        b'{"start_time": true}',
        b"[]",
        b"7",
        b'{"start_time": -5}',
        b'{"start_time": 1e300}',
        "\udcff",
        12,
    ):
        assert submitted_at_of(record) is None, record
    assert submitted_at_of(b'{"start_time": 1764237600123, "status": "RUNNING"}') == 1764237600.123


def test_a_run_whose_rows_all_failed_holds_no_engine() -> None:
    clock = RunClock(started=T0, rows_ready=T0 + 3, committed=T0 + 4)

    timings = run_timings(clock, [], replicas=2, gpus_per_replica=1.0)

    assert timings["gpu_seconds_held"] is None and timings["replicas"] == 0
    assert timings["engine_start_to_first_row_s"] is None and timings["generating_s"] is None
    assert timings["commit_s"] == 1.0


def test_parts_without_a_time_are_skipped() -> None:
    assert first_and_last_written([{}, {"written_at": "garbage"}, sidecar(T0 + 5)]) == (T0 + 5, T0 + 5)
    assert first_and_last_written([{}]) == (None, None)


@given(
    st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), min_size=5, max_size=5),
    st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), max_size=20),
    st.integers(min_value=1, max_value=64),
    st.sampled_from([0.0, 0.25, 1.0, 8.0]),
)
def test_phases_are_never_negative_and_gpu_seconds_follow_the_engine_stage(
    offsets: list[float], written: list[float], replicas: int, gpus: float
) -> None:
    started, ready, engine_started, engine_done, committed = (T0 + o for o in sorted(offsets))
    clock = RunClock(started, ready, engine_started, engine_done, committed)

    timings = run_timings(clock, [sidecar(T0 + w) for w in written], replicas, gpus)

    assert all(v is None or v >= 0 for k, v in timings.items() if k.endswith("_s"))
    assert timings["gpu_seconds_held"] == round(replicas * gpus * timings["engine_stage_s"], 1)
    assert timings["replica_seconds_held"] == round(replicas * timings["engine_stage_s"], 1)


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
clocks = scalars | st.fixed_dictionaries(
    {"id": st.sampled_from(["a", "b"]) | scalars},
    optional={key: scalars for key in ("loaded_at", "init_started_at", "engine_ready_at")},
)


@given(
    st.lists(
        st.fixed_dictionaries({}, optional={"written_at": scalars, REPLICA_KEY: clocks}),
        max_size=6,
    )
)
def test_any_sidecar_gives_phases_or_none_and_never_raises(parts: list[dict[str, object]]) -> None:
    phases = replica_phases(parts, engine_started=T0)

    for phase in phases:
        assert isinstance(phase["replica"], str)
        assert all(value is None or value >= 0 for key, value in phase.items() if key.endswith("_s"))


def test_rows_generated_are_those_this_tries_engines_staged() -> None:
    """``rows_generated``: the rows of the parts this try's engines staged (none resumed), in its
    ``generating_s``: what a dry run scales its estimate by (pipeline/dry_run.py)."""
    clock = RunClock(started=0.0, rows_ready=1.0, engine_started=2.0, engine_done=30.0)
    engine_parts = [
        {"sources": ["a:1", "a:2"], "written_at": "1970-01-01T00:00:10+00:00", "first_row_in_engine_at": 5.0},
        {"sources": ["a:3"], "written_at": "1970-01-01T00:00:25+00:00", "first_row_in_engine_at": 5.0},
    ]
    timings = run_timings(clock, engine_parts, replicas=1, gpus_per_replica=1.0)
    assert (timings["rows_generated"], timings["generating_s"]) == (3, 20.0)
    assert run_timings(RunClock(started=0.0), [], replicas=1, gpus_per_replica=1.0)["rows_generated"] == 0
