"""Warm engines across jobs (``keep_warm_seconds``), as real Ray jobs on the local cluster with vLLM's
CPU engine: a second job starts on the first one's engine, and a replica killed mid-job is replaced
and no row is lost or doubled. Two concurrent jobs sharing a pool of two replicas (one per node), and
a pool scaled to zero after its keep-warm window, are tests/integration/test_multinode.py.

The pool is the session's: the one the later tests' text jobs share (same model and engine settings),
started cold here and left warm for them, its replacement replica the engine they run on.

The test process has no Ray (the Airflow side stays light): it looks at the pool through small Ray
jobs of its own (:func:`_pool`), and kills a replica by its process id (:func:`_replica_pid`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook, _Request
from tests.conftest import TEST_KEEP_WARM_SECONDS, engine_plan, submit_pipeline, wait_for_job
from tests.integration.test_pipeline_job import make_operator

# The subject is a pool's start (its first job cold) and a replica's replacement: it starts the
# session's pool, after the other cold-engine tests and before any test that shares it.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.cold_engine,
    pytest.mark.session_pool,
    pytest.mark.timeout(1200),
]


_POOL_SCRIPT = """
import json, ray
ray.init()
out = []
for entry in ray.util.list_named_actors(all_namespaces=True):
    if entry["namespace"] == "raybatch_engine_pool":
        replica = ray.get_actor(entry["name"], namespace=entry["namespace"])
        try:
            out.append({"name": entry["name"], **ray.get(replica.health.remote(), timeout=120)})
        except Exception as err:
            out.append({"name": entry["name"], "error": type(err).__name__})
print("POOL=" + json.dumps(out))
"""


def _on_cluster(script: str) -> str:
    """Run ``script`` as a Ray job of its own; its log."""
    hook = RayHook()
    job_id = hook.submit_job(
        f"python -c {shlex.quote(script)}", submission_id=f"pool-probe-{uuid.uuid4().hex[:8]}"
    )
    status = wait_for_job(job_id, timeout=300)
    logs = hook.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    return logs


def _pool(fingerprint: str) -> list[dict]:
    """The live replicas of the pool for ``fingerprint`` and what each says of itself
    (EngineReplica.health). Only this pool's: the Airflow-driven tests before this file leave pools
    of their own warm for a few minutes (tests/conftest.py TEST_KEEP_WARM_SECONDS)."""
    [line] = [line for line in _on_cluster(_POOL_SCRIPT).splitlines() if line.startswith("POOL=")]
    replicas = json.loads(line.removeprefix("POOL="))
    return [replica for replica in replicas if replica["name"].rsplit("-", 1)[0].endswith(fingerprint)]


def _replica_pid(name: str) -> int:
    """The process of the live pool replica ``name``, from Ray's state API: killed with a signal, it
    dies at once (``max_restarts=0``: the stage replaces it). A Ray job of our own that called
    ``ray.kill`` took seconds to start, and a warm job had staged all its rows by then."""
    payload = RayHook()._send(_Request("GET", "/api/v0/actors?detail=true&limit=10000")).json()
    actors = payload["data"]["result"]["result"]
    [actor] = [a for a in actors if a.get("name") == name and a.get("state") == "ALIVE"]
    return int(actor["pid"])


def _tickets(path: Path, count: int, prefix: str) -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "ticket_id": ticket,
                    "channel": "email",
                    "messages": [{"role": "user", "content": f"Ticket {ticket}: my parcel is late."}],
                }
            )
            + "\n"
            for ticket in ids
        )
    )
    return ids


def _run(
    tiny_model: Path, folder: Path, name: str, count: int, keep_warm: float, **overrides
) -> tuple[str, list[str]]:
    ids = _tickets(folder / name / "in.jsonl", count, f"{name}-")
    operator = make_operator(
        tiny_model,
        str(folder / name / "in.jsonl"),
        str(folder / name / "out"),
        keep_warm_seconds=keep_warm,
        **overrides,
    )
    return submit_pipeline(operator, name, f"pool-{name}-{uuid.uuid4().hex[:8]}"), ids


def _committed(folder: Path, name: str, job_id: str, ids: list[str]) -> dict:
    """The job succeeded and committed every id exactly once; its manifest."""
    assert wait_for_job(job_id) == JobStatus.SUCCEEDED, RayHook().get_job_log_tail(job_id, 80)
    manifest = json.loads((folder / name / "out" / "manifest.json").read_text())
    outputs = pq.read_table(manifest["outputs_uri"]).to_pylist()
    assert sorted(row["ticket_id"] for row in outputs) == ids
    assert manifest["rows_in"] == manifest["rows_out"] == len(ids) and manifest["rows_failed"] == 0
    return manifest


def test_a_second_job_starts_warm_and_a_killed_replica_is_replaced(
    ray_connection, tiny_model, tmp_path
) -> None:
    first, first_ids = _run(tiny_model, tmp_path, "first", 40, keep_warm=600)
    cold_manifest = _committed(tmp_path, "first", first, first_ids)
    cold = cold_manifest["engine_pool"]
    assert (cold["replicas"], cold["warm_replicas"]) == (1, 0)
    # The build this job paid for is in its timings, and it held the replica from its lease.
    timings, [built] = cold_manifest["timings"], cold["replica_timings"]
    assert timings["engine_build_s"] == built["engine_build_seconds"] > 0, timings
    assert timings["replica_seconds_held"] >= round(timings["engine_stage_s"], 1), timings
    [replica] = _pool(cold["fingerprint"])
    assert replica["name"].endswith(f"{cold['fingerprint']}-0")
    assert (replica["jobs_served"], replica["rows_done"], replica["leases"], replica["in_flight"]) == (
        1,
        40,
        0,
        0,
    )

    # The second job starts warm workers of its own (none by default on a 2-core machine): a job-side
    # setting, which leaves the pool the same (engine_pool.JOB_SIDE_SETTINGS).
    second, second_ids = _run(
        tiny_model,
        tmp_path,
        "second",
        40,
        keep_warm=600,
        runtime_env={"env_vars": {"RAYBATCH_WARM_WORKERS": "2"}},
    )
    warm = _committed(tmp_path, "second", second, second_ids)["engine_pool"]
    assert (warm["fingerprint"], warm["warm_replicas"]) == (cold["fingerprint"], 1)
    assert [timing["rows"] for timing in warm["replica_timings"]] == [40]  # the replica's share: all
    log = RayHook().get_job_logs(second)
    assert "Starting 2 warm workers for this job" in log
    assert "Filter(" not in engine_plan(log)  # no row rejected: no filter pass before the engine
    [replica] = _pool(cold["fingerprint"])
    assert (replica["jobs_served"], replica["rows_done"]) == (2, 80)  # the same engine, not a new one

    # (Another engine setting is another pool, never the same engine: tests/unit/pipeline/
    # test_engine_pool.py, setting by setting; a cold job here to show it once more costs CI a build.)

    # A replica killed while a job's rows are in it: replaced, and every row committed exactly once.
    pid = _replica_pid(replica["name"])
    third, third_ids = _run(
        tiny_model,
        tmp_path,
        "third",
        600,
        keep_warm=TEST_KEEP_WARM_SECONDS,
        sampling_params={"temperature": 0, "max_tokens": 48},
    )
    out = tmp_path / "third" / "out"  # the replicas stage parts into the version folder as rows finish
    deadline = time.monotonic() + 600
    while not list(out.rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(out.rglob("*.parquet")), "the third job staged nothing"
    os.kill(pid, signal.SIGKILL)
    assert not RayHook().get_job_status(third).is_terminal, "the replica was killed after the job ended"
    manifest = _committed(tmp_path, "third", third, third_ids)
    assert manifest["engine_pool"]["warm_replicas"] == 1
    # The replacement stays, the session's warm engine, for the session's keep-warm window.
    [replacement] = _pool(cold["fingerprint"])
    assert _replica_pid(replacement["name"]) != pid
