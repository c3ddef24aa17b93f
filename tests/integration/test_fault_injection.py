"""Fault injection on the real local cluster: kill the Ray job or the waiting task, then retry.

What must hold: every id exactly once in the committed output, no row lost, no second Ray job for a
retried task, and a resumed run redoes only the batches that were in flight (none it had finished).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from tests.integration.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA, submit_pipeline, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

ROWS = 400
BATCH = 8
IN_FLIGHT_BATCHES = 2  # max_concurrent_batches of the one replica
_BATCH_DONE = re.compile(r"\[vLLM\] Elapsed time for batch \w+ with size (\d+)")


def _params(model: Path, input_uri: str, output_uri: str) -> dict:
    return dict(
        model=str(model),
        input_uri=input_uri,
        output_uri=output_uri,
        user_template="Summarise ticket {ticket_id}: {text}",
        id_column="ticket_id",
        keep_columns=["text"],
        # Free text of a fixed length keeps the engine busy long enough to be killed mid-run.
        sampling_params={"temperature": 0, "max_tokens": 160, "ignore_eos": True},
        engine_kwargs=CPU_ENGINE_KWARGS,
        replica_resources=CPU_REPLICA,
        batch_size=BATCH,
        max_concurrent_batches=IN_FLIGHT_BATCHES,
    )


def _write_tickets(path: Path) -> list[str]:
    ids = [f"T{i:04d}" for i in range(ROWS)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"ticket_id": i, "text": f"parcel {i} is late"}) + "\n" for i in ids))
    return ids


def _committed_parts(output_uri: str, run_key: str) -> int:
    parts = Path(output_uri, "_staging", run_key, "parts")
    return len(list(parts.glob("*.json"))) if parts.exists() else 0


def _rows_generated(job_log: str) -> int:
    return sum(int(size) for size in _BATCH_DONE.findall(job_log))


def _assert_exactly_once(output_uri: str, ids: list[str]) -> dict:
    manifest = json.loads(Path(output_uri, "manifest.json").read_text())
    outputs = pq.read_table(manifest["outputs_uri"]).column("ticket_id").to_pylist()
    assert len(outputs) == len(set(outputs)), "duplicate rows in the committed output"
    assert sorted(outputs) == ids, f"lost rows: {sorted(set(ids) - set(outputs))[:5]}"
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (ROWS, ROWS, 0)
    return manifest


@pytest.mark.parametrize(
    ("kill_after_parts", "label"),
    [(0, "before any part"), (1, "after the first part"), (ROWS // BATCH // 2, "half way")],
)
def test_killed_job_resumes_exactly_once(
    ray_connection, tiny_model, tmp_path, kill_after_parts: int, label: str, capsys
) -> None:
    ids = _write_tickets(tmp_path / "in" / "tickets.jsonl")
    output_uri = str(tmp_path / "out")
    operator = RayLLMBatchOperator(task_id="t", **_params(tiny_model, str(tmp_path / "in" / "tickets.jsonl"), output_uri))
    hook, run_key = RayHook(), "fault-run"

    first = submit_pipeline(operator, run_key, f"fault-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = hook.get_job_status(first)
        assert not status.is_terminal, f"job ended ({status}) before the kill point: {hook.get_job_log_tail(first)}"
        if status == JobStatus.RUNNING and _committed_parts(output_uri, run_key) >= kill_after_parts:
            break
        time.sleep(0.2)
    finished_before_stop = _rows_generated(hook.get_job_logs(first))  # batches the engine had done
    hook.stop_job(first)
    assert wait_for_job(first) == JobStatus.STOPPED
    staged_at_kill = _committed_parts(output_uri, run_key)
    generated_before_kill = _rows_generated(hook.get_job_logs(first))
    assert not Path(output_uri, "manifest.json").exists()  # nothing visible from a killed run

    second = submit_pipeline(operator, run_key, f"fault-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(second) == JobStatus.SUCCEEDED, hook.get_job_log_tail(second, 60)
    manifest = _assert_exactly_once(output_uri, ids)
    resumed = manifest["rows_resumed"]
    recomputed = max(generated_before_kill - resumed, 0)
    # Of those, done before the stop was asked for (the rest finished while the job was being stopped).
    recomputed_done_before_stop = max(finished_before_stop - resumed, 0)
    assert resumed >= staged_at_kill * 1 and (resumed > 0) == (staged_at_kill > 0)
    # A batch the engine finished is staged by its replica before it leaves the replica, so the rerun
    # redoes only batches still in flight (never counted as generated). At most one finished batch per
    # replica can be lost: one the replica logged as done and was killed while staging (measured: 0).
    assert recomputed <= BATCH, (generated_before_kill, resumed)
    assert _rows_generated(hook.get_job_logs(second)) == ROWS - resumed
    with capsys.disabled():
        print(
            f"\n[fault] kill {label}: parts staged {staged_at_kill}, rows generated before kill "
            f"{generated_before_kill}, resumed {resumed}, recomputed {recomputed}, duplicates 0, lost 0"
            f"; of those done before the stop was asked: {recomputed_done_before_stop}"
            f" (engine rows done then: {finished_before_stop})"
        )


def test_killed_waiting_task_reattaches_instead_of_resubmitting(ray_connection, tiny_model, tmp_path) -> None:
    ids = _write_tickets(tmp_path / "in" / "tickets.jsonl")
    output_uri = str(tmp_path / "out")
    params = json.dumps(_params(tiny_model, str(tmp_path / "in" / "tickets.jsonl"), output_uri))
    script = Path(__file__).with_name("operator_process.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def ours() -> list:
        return [job for job in RayHook().list_jobs() if job.metadata.get("airflow_dag_id") == "fault_dag"]

    # Try 1 submits, then its process is killed (SIGKILL: no on_kill, nothing cleaned up) while it waits.
    worker = subprocess.Popen([sys.executable, str(script), params, "1"], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ours() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    [job] = ours()
    assert not RayHook().get_job_status(job.job_id).is_terminal

    # Try 2 finds the running job and attaches to it.
    retry = subprocess.run([sys.executable, str(script), params, "2"], env=env, capture_output=True, text=True, timeout=900)
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert "attaching to it" in retry.stderr + retry.stdout
    assert [j.job_id for j in ours()] == [job.job_id]
    assert json.loads(retry.stdout.split("RESULT ", 1)[1]) == output_uri
    _assert_exactly_once(output_uri, ids)

    # Try 3 (the task cleared after success, same parameters) takes the result: still one job.
    again = subprocess.run([sys.executable, str(script), params, "3"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "succeeded; taking its result" in again.stderr + again.stdout
    assert len(ours()) == 1
