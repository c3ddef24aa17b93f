"""pipeline/dry_run.py: the rate a dry run scales a backfill's estimate by, from the last committed run,
and the engine and GPU time it estimates at that rate."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_provider_raybatch.pipeline import dry_run
from airflow_provider_raybatch.pipeline.reporting.timings import RunClock, run_timings
from airflow_provider_raybatch.shared.layout import plan_layout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec


def _commit(folder: Path, **manifest: object) -> str:
    (folder / "manifest.json").write_text(json.dumps({"rows_in": 120, "rows_out": 100, **manifest}))
    return str(folder)


def test_the_rate_is_the_engines_while_generating_with_start_up_apart(tmp_path: Path) -> None:
    timings = {"generating_s": 20.0, "engine_start_to_first_row_s": 45.0}
    rate = dry_run._measured_rate(_commit(tmp_path, wall_seconds=80.0, timings=timings))
    assert rate == dry_run.MeasuredRate(5.0, 45.0, "last run, while generating")


def test_a_commit_of_held_rows_takes_the_rate_of_the_try_that_generated_them(tmp_path: Path) -> None:
    """The retry that committed a held try's rows ran no engine (its generating_s is None):
    its rows over its 11 s of wall time would make a backfill look ten times as fast as it is."""
    held_try = {"job_id": "j0", "timings": {"generating_s": 25.0, "engine_start_to_first_row_s": 40.0}}
    rate = dry_run._measured_rate(
        _commit(tmp_path, wall_seconds=11.0, timings={"generating_s": None}, held_try=held_try)
    )
    assert rate == dry_run.MeasuredRate(4.0, 40.0, "last run, while generating")


def test_without_timings_the_rate_is_rows_over_wall_time(tmp_path: Path) -> None:
    assert dry_run._measured_rate(_commit(tmp_path, wall_seconds=60.0)) == dry_run.MeasuredRate(
        2.0, 0.0, "last run"
    )
    assert dry_run._measured_rate(str(tmp_path / "nothing-committed")) is None


def test_the_rate_counts_only_the_rows_the_measured_try_generated(tmp_path: Path) -> None:
    """A retry that resumed 900 of 1,000 rows generated 100 in its 10 s: 10 rows/s, not 100."""
    timings = {"generating_s": 10.0, "engine_start_to_first_row_s": 30.0, "rows_generated": 100}
    rate = dry_run._measured_rate(
        _commit(tmp_path, rows_in=1000, rows_out=1000, rows_resumed=900, wall_seconds=50.0, timings=timings)
    )
    assert rate == dry_run.MeasuredRate(10.0, 30.0, "last run, while generating")


def test_without_rows_generated_the_resumed_rows_are_left_out(tmp_path: Path) -> None:
    """A manifest from before ``timings.rows_generated``: its rows out less those it resumed."""
    timings = {"generating_s": 10.0, "engine_start_to_first_row_s": 30.0}
    rate = dry_run._measured_rate(
        _commit(tmp_path, rows_in=1000, rows_out=1000, rows_resumed=900, wall_seconds=50.0, timings=timings)
    )
    assert rate == dry_run.MeasuredRate(10.0, 30.0, "last run, while generating")
    # without timings at all: the rows it did over its wall time
    assert dry_run._measured_rate(
        _commit(tmp_path, rows_in=1000, rows_out=1000, rows_resumed=900, wall_seconds=50.0)
    ) == dry_run.MeasuredRate(2.0, 0.0, "last run")


def test_a_held_try_that_resumed_rows_counts_only_those_it_generated(tmp_path: Path) -> None:
    """The committing try generated nothing; the held try resumed 60 of the 100 rows and generated 40."""
    held_try = {
        "job_id": "j0",
        "timings": {"generating_s": 20.0, "engine_start_to_first_row_s": 40.0, "rows_generated": 40},
    }
    rate = dry_run._measured_rate(
        _commit(
            tmp_path, rows_resumed=100, wall_seconds=11.0, timings={"generating_s": None}, held_try=held_try
        )
    )
    assert rate == dry_run.MeasuredRate(2.0, 40.0, "last run, while generating")


def _spec(**params: object) -> BatchInferenceSpec:
    return BatchInferenceSpec.build(
        model="m", input_uri="/in.jsonl", output_uri="/out", run_key="k", user_template="{text}", **params
    )


def test_gpu_seconds_count_every_gpu_of_every_replica_as_gpu_seconds_held_does() -> None:
    """4 replicas of 1 GPU for 50 s of start-up and 1,000 rows at 10 rows/s: 150 s, 600 GPU-seconds."""
    four = plan_layout(_spec(concurrency=4))
    assert dry_run.engine_estimate(1000, 10.0, 50.0, four) == {
        "estimated_engine_seconds": 150,
        "estimated_gpu_seconds": 600,
    }
    # the same count as a run's timings: replicas x GPUs per replica x the engine stage's seconds
    clock = RunClock(started=0.0, engine_started=0.0, engine_done=150.0)
    held = run_timings(clock, [], four.max_replicas, four.gpus_per_replica)["gpu_seconds_held"]
    assert held == dry_run.engine_estimate(1000, 10.0, 50.0, four)["estimated_gpu_seconds"]
    quarter = plan_layout(_spec(concurrency=(1, 4), replica_resources={"CPU": 1, "GPU": 0.25}))
    assert dry_run.engine_estimate(1000, 10.0, 50.0, quarter)["estimated_gpu_seconds"] == 150
    tensor_parallel = plan_layout(_spec(concurrency=2, engine_kwargs={"tensor_parallel_size": 2}))
    assert dry_run.engine_estimate(1000, 10.0, 50.0, tensor_parallel)["estimated_gpu_seconds"] == 600
    cpu_engine = plan_layout(_spec(concurrency=4, replica_resources={"CPU": 4}))
    assert dry_run.engine_estimate(1000, 10.0, 50.0, cpu_engine)["estimated_gpu_seconds"] == 0
    assert dry_run.engine_estimate(1000, None, 50.0, four) == {
        "estimated_engine_seconds": None,
        "estimated_gpu_seconds": None,
    }
