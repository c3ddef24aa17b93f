"""Tests of pipeline/reporting/timings.py: the manifest's account of where the time and GPUs went."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.reporting.timings import RunClock, first_and_last_written, run_timings

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC).timestamp()


def sidecar(at: float) -> dict[str, str]:
    return {"written_at": datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")}


def test_a_run_with_an_engine() -> None:
    clock = RunClock(
        started=T0, rows_ready=T0 + 12, engine_started=T0 + 13, engine_done=T0 + 100, committed=T0 + 101.5
    )
    parts = [sidecar(T0 + 60), sidecar(T0 + 99), sidecar(T0 + 45)]

    timings = run_timings(clock, parts, replicas=4, gpus_per_replica=0.25)

    assert timings == {
        "read_and_prepare_s": 12.0,
        "engine_start_to_first_row_s": 32.0,
        "generating_s": 54.0,
        "engine_stage_s": 87.0,
        "commit_s": 1.5,
        "replicas": 4,
        "gpus_per_replica": 0.25,
        "gpu_seconds_held": 87.0,  # 4 x 0.25 GPU x 87 s
    }


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
