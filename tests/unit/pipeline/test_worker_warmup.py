"""Tests of airflow_provider_raybatch/pipeline/worker_warmup.py: the driver starts warm workers that the
job's later tasks run on, on a real local Ray."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.pipeline import worker_warmup
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.ray_env import run_in_ray_env

_ON_RAY = """
import json, os, time
import ray
ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)  # three tasks at a time
from airflow_provider_raybatch.pipeline import worker_warmup
warm = ray.get(worker_warmup.start(3), timeout=120)

@ray.remote
def later(_):
    import sys
    return os.getpid(), "airflow_provider_raybatch.pipeline.row_steps" in sys.modules
after = ray.get([later.remote(i) for i in range(6)])
os.environ[worker_warmup.WARM_WORKERS_ENV] = "0"
none = worker_warmup.start(worker_warmup.configured_workers(8))
print(json.dumps({"warm": warm, "after": after, "none": len(none)}))
"""


def test_the_warm_workers_are_distinct_and_the_jobs_later_tasks_run_on_them_with_the_row_code_imported() -> (
    None
):
    out = run_in_ray_env(_ON_RAY)

    assert len(set(out["warm"])) == 3  # held side by side: three processes, not one reused
    assert {pid for pid, _ in out["after"]} <= set(out["warm"])  # no new process for the job's tasks
    assert all(imported for _, imported in out["after"])
    assert out["none"] == 0  # RAYBATCH_WARM_WORKERS=0 starts none


@pytest.mark.parametrize("value", ["-1", "2.5", "many", "65"])
def test_a_bad_setting_fails_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(worker_warmup.WARM_WORKERS_ENV, value)

    with pytest.raises(ValueError, match=worker_warmup.WARM_WORKERS_ENV):
        worker_warmup.configured_workers()


@pytest.mark.parametrize(
    ("cores", "replicas", "expected"),
    [(1, 1, 0), (2, 1, 0), (7, 1, 1), (16, 1, 4), (16, 4, 4), (32, 2, 5), (128, 4, 7), (128, 0, 4)],
)
def test_one_more_for_each_replica_and_fewer_on_a_small_machine(
    monkeypatch: pytest.MonkeyPatch, cores: int, replicas: int, expected: int
) -> None:
    monkeypatch.delenv(worker_warmup.WARM_WORKERS_ENV, raising=False)
    monkeypatch.setattr(worker_warmup.os, "cpu_count", lambda: cores)

    assert worker_warmup.configured_workers(replicas) == expected


@pytest.mark.parametrize(("concurrency", "replicas"), [(1, 1), (3, 3), ((1, 4), 4)])
def test_the_replicas_are_the_specs_most(concurrency: int | tuple[int, int], replicas: int) -> None:
    spec = BatchInferenceSpec.build(
        model="m", input_uri="/in/a.jsonl", output_uri="/out", user_template="{a}", concurrency=concurrency
    )

    assert worker_warmup.replicas_of(spec) == replicas


def test_the_setting_wins_over_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(worker_warmup.WARM_WORKERS_ENV, "6")
    monkeypatch.setattr(worker_warmup.os, "cpu_count", lambda: 2)

    assert worker_warmup.configured_workers() == 6
