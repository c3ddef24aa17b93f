"""common.ai's ``@task.llm_batch`` / ``LLMBatchOperator`` with ``model_id="raybatch:<model>"``, for real.

The real apache-airflow-providers-common-ai package (its operator, trigger, state and results
layers), real Airflow (``airflow dags test``, deferred through common.ai's ``LLMBatchTrigger``), the
local Ray cluster and vLLM's CPU engine on the tiny model: ``dags/common_ai_llm_batch.py`` end to end,
a retry that re-attaches to the running job instead of resubmitting, and a batch stopped on the
cluster while it runs (cancelled; the retry submits a job of its own).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# The common-ai extra (scripts/setup_envs.sh installs it): without it these tests fail, never skip.
import airflow.providers.common.ai  # noqa: F401
import pytest

from tests.conftest import (
    AIRFLOW_BIN,
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    hold_free_cpus,
    warm_conf,
)
from tests.run_record import note

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DECORATOR_DAG = "common_ai_llm_batch"
KEY_META = "common_ai_idempotency_key"


def _env(airflow_env, ray_cluster, extra: dict | None = None):
    """``ray_default`` as common.ai needs it: the full address in the host, the token as password."""
    conn = {
        "conn_type": "ray",
        "host": ray_cluster.address,
        "password": ray_cluster.token,
        "extra": extra or {},
    }
    return airflow_env.with_env(AIRFLOW_CONN_RAY_DEFAULT=json.dumps(conn))


def _conf(model: Path, root: Path) -> dict:
    return {
        "model": str(model),
        "result_root": str(root),
        # Compact JSON (CPU_ENGINE_KWARGS has it): else common.ai reports every answer as invalid_output.
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
    }


def _warm_env(airflow_env, ray_cluster):
    """:func:`_env` with the session's warm engines as the connection's job defaults: the retry tests'
    subject is common.ai's retries and our adapter, not an engine's start."""
    return _env(airflow_env, ray_cluster, {"llm_batch": warm_conf()})


def _hook(ray_cluster):
    from airflow.sdk import Connection

    from airflow_provider_raybatch.common_ai.adapter import _FixedRayHook
    from airflow_provider_raybatch.hooks.ray import RayConnectionSettings

    conn = Connection(conn_id="t", conn_type="ray", host=ray_cluster.address, password=ray_cluster.token)
    return _FixedRayHook(RayConnectionSettings.from_connection(conn))


def _jobs_of(hook, dag_id: str) -> list:
    return [job for job in hook.list_jobs() if job.metadata.get("airflow_dag_id") == dag_id]


def _xcoms(home: Path, dag_id: str) -> dict[tuple[str, str], object]:
    """(task_id, key) -> value of the DAG's XComs (one run per DAG here). A task returning a typed dict
    pushes its keys too, which SQLite hands back as numbers, not JSON text."""
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute("SELECT task_id, key, value FROM xcom WHERE dag_id = ?", (dag_id,)).fetchall()
    return {(task, key): json.loads(value) if isinstance(value, str) else value for task, key, value in rows}


def _rendered_fields(home: Path, dag_id: str) -> str:
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute(
            "SELECT rendered_fields FROM rendered_task_instance_fields WHERE dag_id = ?", (dag_id,)
        )
        return " ".join(str(row[0]) for row in rows.fetchall())


def test_llm_batch_decorator_runs_as_our_ray_job(airflow_env, ray_cluster, tiny_model, tmp_path) -> None:
    # On the session's warm engines (the connection's job defaults): this test's subject is the adapter.
    env, day = _warm_env(airflow_env, ray_cluster), "2026-11-20"
    result = env.dags_test(DECORATOR_DAG, day, _conf(tiny_model, tmp_path))
    log = result.stdout + result.stderr
    (tmp_path / "dags_test.log").write_text(log)
    assert result.returncode == 0 and "state=success" in log, log[-6000:]
    assert "running trigger in line" in log  # deferred: common.ai's LLMBatchTrigger waited for the job
    assert ray_cluster.token not in log

    xcoms = _xcoms(airflow_env.home, DECORATOR_DAG)
    manifest = xcoms[("build_summary_requests", "return_value")]
    batch_id = manifest["batch_id"]
    assert batch_id.startswith("raybatch-common_ai_llm_batch-build_summary_requests-")
    assert f"Submitted Ray job {batch_id} (6 requests" in log
    assert xcoms[("build_summary_requests", "batch_id")] == batch_id
    assert manifest["adapter"] == "raybatch" and manifest["llm_conn_id"] == "ray_default"
    assert manifest["model_id"] == f"raybatch:{tiny_model}"
    assert manifest["request_count"] == 6
    assert manifest["counts"] == {
        "succeeded": 5,
        "errored": 1,
        "invalid_output": 0,
        "expired": 0,
        "cancelled": 0,
        "missing": 0,
    }
    assert manifest["terminal_reason"] == "partial"
    lines = Path(manifest["result_uri"]).read_text().splitlines()
    rows = sorted((json.loads(line) for line in lines), key=lambda row: row["index"])  # common.ai: unordered
    assert [row["index"] for row in rows] == list(range(6))
    assert rows[4]["usage"]["output_tokens"] <= 8  # that request's own max_tokens
    assert [row["status"] for row in rows] == ["success"] * 5 + ["error"]
    assert all(isinstance(row["output"], str) for row in rows[:5])
    assert "reasoning_effort" in json.dumps(rows[5]["error"])  # the request that asked for it, alone
    assert xcoms[("summarize_manifest", "return_value")] == {"success": 5, "error": 1}
    for value in xcoms.values():
        assert ray_cluster.token not in json.dumps(value)
    assert ray_cluster.token not in _rendered_fields(airflow_env.home, DECORATOR_DAG)

    # Our side: one Ray job, our manifest committed last at the batch's output folder.
    hook = _hook(ray_cluster)
    (job,) = _jobs_of(hook, DECORATOR_DAG)
    assert job.job_id == batch_id and job.status.value == "SUCCEEDED"
    assert ray_cluster.token not in json.dumps(job.metadata) + job.entrypoint
    committed = json.loads((Path(job.metadata["raybatch_output_uri"]) / "manifest.json").read_text())
    assert committed["job_id"] == batch_id
    assert (committed["rows_in"], committed["rows_out"], committed["rows_failed"]) == (6, 5, 1)


#: Test DAGs: LLMBatchOperator with retries, as a DAG author would configure them.
RETRY_DAGS = """
from datetime import timedelta
from typing import Literal
from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator
from airflow.sdk import dag

REVIEWS = ["Great value.", "Arrived broken.", "It is fine.", "Would not buy again."]


class QuickPollLLMBatchOperator(LLMBatchOperator):
    # common.ai holds poll_interval at 30 s or more, a hosted batch API's pace. These DAGs poll every
    # 2 s, so each wait is seconds, not half a minute: the retries, re-attach and cancel under test
    # do not depend on the interval.
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.poll_interval = 2
RAYBATCH = {"engine_kwargs": "{{ params.engine_kwargs | tojson }}",
            "replica_resources": "{{ params.replica_resources | tojson }}"}


def classify(**kwargs):
    return QuickPollLLMBatchOperator(
        task_id="classify", requests=[f"Review: {r}" for r in REVIEWS],
        result_path="{{ params.result_root }}/{{ dag.dag_id }}/{{ run_id }}", llm_conn_id="ray_default",
        model_id="raybatch:{{ params.model }}", system_prompt="Classify the sentiment.",
        output_type=Literal["positive", "negative", "neutral"], max_tokens=64,
        request_params={"temperature": 0, "raybatch": RAYBATCH},
        retry_delay=timedelta(seconds=1), **{"deferrable": True, **kwargs},
    )


@dag(schedule=None)
def common_ai_retry_reattach():
    # Each try waits at most 5 s and leaves the batch running: the next try re-attaches to it.
    classify(timeout=5, cancel_on_timeout=False, retries=8)


@dag(schedule=None)
def common_ai_retry_after_cancel():
    # Waits in the worker (common.ai's own poll loop): the deferred path is the other two tests'.
    classify(retries=1, deferrable=False)


common_ai_retry_reattach()
common_ai_retry_after_cancel()
"""


def _popen_dags_test(env, dags: Path, dag_id: str, day: str, conf: dict) -> subprocess.Popen:
    """``airflow dags test`` of a test DAG in its own DAGs folder (``-f`` takes only files under the
    configured one), its output written as it runs to ``dags_test.log`` beside the folder."""
    command = [str(AIRFLOW_BIN), "dags", "test", dag_id, day, "--conf", json.dumps(conf)]
    note("dags_test", dag_id=dag_id)
    with (dags.parent / "dags_test.log").open("w") as log:
        return subprocess.Popen(
            command,
            env={**env.env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


@contextmanager
def _beside_a_cpu_hold(
    hook, seconds: float, start: Callable[[], subprocess.Popen]
) -> Iterator[tuple[str, subprocess.Popen]]:
    """The cluster's free CPUs held (:func:`hold_free_cpus`), then ``start``'s ``dags test`` process:
    (the holding job's id, the process). Afterwards the hold ends and the process is gone."""
    holder = hold_free_cpus(hook, seconds=seconds)
    process = start()
    try:
        yield holder, process
    finally:
        hook.stop_job(holder)
        if process.poll() is None:
            process.kill()


def _log_of(process: subprocess.Popen, dags: Path, timeout: float = 840) -> str:
    """The whole output of a :func:`_popen_dags_test` once it has ended."""
    process.wait(timeout=timeout)
    return (dags.parent / "dags_test.log").read_text()


def _retry_dags(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "common_ai_retry_dags.py").write_text(RETRY_DAGS)
    return dags


def _labels(manifest: dict) -> set:
    rows = [json.loads(line) for line in Path(manifest["result_uri"]).read_text().splitlines()]
    assert {row["status"] for row in rows} == {"success"}, rows
    return {row["output"] for row in rows}


def _driver_started(hook, job_id: str) -> bool:
    """Whether the job's driver is running and has logged (a stop then reaches it, not a pending job)."""
    return hook.get_job_status(job_id) == "RUNNING" and bool(hook.get_job_logs(job_id).strip())


def test_a_retry_reattaches_to_the_running_job_instead_of_resubmitting(
    airflow_env, ray_cluster, tiny_model, tmp_path
) -> None:
    dag_file = _retry_dags(tmp_path)
    env, day, hook = _warm_env(airflow_env, ray_cluster), "2026-11-21", _hook(ray_cluster)
    # The cluster's free CPUs are held until try 1 has given up (timeout=5): the batch's job runs on
    # the session's warm engines, its read waiting for a CPU, so it is still running when try 1's
    # trigger times out, however fast the machine (unheld, a job of 4 rows can end before any timeout).
    start = lambda: _popen_dags_test(  # noqa: E731
        env, dag_file, "common_ai_retry_reattach", day, _conf(tiny_model, tmp_path)
    )
    with _beside_a_cpu_hold(hook, 600, start) as (holder, process):
        timed_out = "did not reach a terminal status within timeout=5s"
        deadline = time.monotonic() + 600
        while timed_out not in (tmp_path / "dags_test.log").read_text():
            assert time.monotonic() < deadline and process.poll() is None, "try 1 did not time out"
            time.sleep(0.5)
        hook.stop_job(holder)
        log = _log_of(process, dag_file)
    assert "state=success" in log, log[-6000:]
    (job,) = _jobs_of(hook, "common_ai_retry_reattach")  # one job, whatever the number of tries
    assert f"Re-attaching to batch {job.job_id}" in log
    manifest = _xcoms(airflow_env.home, "common_ai_retry_reattach")[("classify", "return_value")]
    assert manifest["batch_id"] == job.job_id and "-t1-" in job.job_id  # submitted by try 1
    assert _labels(manifest) <= {"positive", "negative", "neutral"}


def test_a_batch_stopped_on_the_cluster_is_cancelled_and_the_retry_submits_a_new_job(
    airflow_env, ray_cluster, tiny_model, tmp_path
) -> None:
    dag_file = _retry_dags(tmp_path)
    env, day, hook = _warm_env(airflow_env, ray_cluster), "2026-11-22", _hook(ray_cluster)
    # The job is stopped while its driver runs, its read waiting for a held CPU. Stopped at once, while
    # PENDING, Ray said "stopped" yet the job ran to SUCCEEDED on a warm engine. The hold ends with
    # the stop: try 2's job then runs at once, on the same warm engines.
    start = lambda: _popen_dags_test(  # noqa: E731
        env, dag_file, "common_ai_retry_after_cancel", day, _conf(tiny_model, tmp_path)
    )
    with _beside_a_cpu_hold(hook, 300, start) as (holder, process):
        deadline = time.monotonic() + 300
        while not (jobs := _jobs_of(hook, "common_ai_retry_after_cancel")) or not _driver_started(
            hook, jobs[0].job_id
        ):
            assert time.monotonic() < deadline and process.poll() is None, "no Ray job was running"
            time.sleep(1)
        (first,) = jobs
        assert hook.stop_job(first.job_id)
        while not hook.get_job_status(first.job_id).is_terminal:  # stopped, not yet given the slot
            assert time.monotonic() < deadline, "the stopped job did not end"
            time.sleep(1)
        hook.stop_job(holder)
        log = _log_of(process, dag_file)
    assert f"Batch '{first.job_id}' was cancelled before 4 of 4 requests completed" in log, log[-6000:]
    assert "state=success" in log, log[-6000:]
    # The cancel cleared common.ai's state: try 2 submitted a job of its own, which ran the batch.
    second = [job for job in _jobs_of(hook, "common_ai_retry_after_cancel") if job.job_id != first.job_id]
    assert [job.metadata["airflow_try_number"] for job in second] == ["2"]
    manifest = _xcoms(airflow_env.home, "common_ai_retry_after_cancel")[("classify", "return_value")]
    assert manifest["batch_id"] == second[0].job_id and manifest["request_count"] == 4
    assert manifest["counts"]["succeeded"] == 4
    assert _labels(manifest) <= {"positive", "negative", "neutral"}


def test_a_connection_the_trigger_cannot_rebuild_fails_before_submitting(
    airflow_env, ray_cluster, tiny_model, tmp_path
) -> None:
    """The README's connection (host and port fields apart) works for RayLLMBatchOperator, but common.ai
    hands adapters the host and password only: the task fails naming the field, before any job."""
    hook = _hook(ray_cluster)
    before = len(_jobs_of(hook, DECORATOR_DAG))
    env = airflow_env.with_env(AIRFLOW_CONN_RAY_DEFAULT=ray_cluster.connection_json())
    result = env.dags_test(DECORATOR_DAG, "2026-11-23", _conf(tiny_model, tmp_path))
    log = result.stdout + result.stderr
    assert "state=failed" in log, log[-6000:]
    port = ray_cluster.address.rsplit(":", 1)[1]
    assert (
        f"ray connection 'ray_default': port={port} (the port field) would not reach common.ai's trigger"
        in log
    ), log[-6000:]
    assert "host='http://ray-head:8265', port empty" in log
    assert ray_cluster.token not in log
    assert len(_jobs_of(hook, DECORATOR_DAG)) == before
