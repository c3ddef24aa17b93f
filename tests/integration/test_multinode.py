"""Two nodes on one machine (the head and a worker raylet of its own): two engine replicas, one per
node, through Ray's own scheduling; the output is complete and has every row exactly once. The same
with a warm pool of two replicas (``keep_warm_seconds``) that two concurrent jobs share: one replica
per node, both built side by side; with replica 0 gone a one-replica job runs warm on replica 1; and
the pool gone after its keep-warm window."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import RayHook, _Request
from airflow_provider_raybatch.shared.manifest import manifest_from_log
from tests.conftest import CPU_ENGINE_KWARGS, REPLICA_SLOT, submit_pipeline, wait_for_job
from tests.integration.test_pipeline_job import make_operator

# Cold engines of its own: the subject is where a job's (and a pool's) replicas are placed.
pytestmark = [pytest.mark.integration, pytest.mark.cold_engine, pytest.mark.timeout(900)]

# Enough batches for both replicas to take some (placement is the subject, not throughput).
ROWS = 64


def _actors(hook: RayHook, class_name: str) -> dict[str, dict]:
    """actor id -> the state API's record of every actor of that class the cluster has run."""
    payload = hook._send(_Request("GET", "/api/v0/actors?detail=true&limit=10000")).json()
    actors = payload["data"]["result"]["result"]
    return {a["actor_id"]: a for a in actors if class_name in (a.get("class_name") or "")}


@pytest.fixture(scope="module", autouse=True)
def _one_node_after(ray_cluster) -> Iterator[None]:
    """The later test files run on the head alone, as before this file added a node."""
    yield
    ray_cluster.remove_worker_nodes()


@pytest.fixture
def two_nodes(ray_connection) -> list:
    """The session's cluster with a second raylet (added once) holding one replica slot, as the head."""
    hook = RayHook()
    if len(hook.get_cluster_resources().nodes) == 1:
        ray_connection.add_worker_node(num_cpus=4, resources={REPLICA_SLOT: 1})
    nodes = hook.get_cluster_resources().nodes
    assert len(nodes) == 2, nodes
    _wait_for_free_slots(hook, total=2)
    return nodes


def _slot_usage(hook: RayHook) -> list[float] | None:
    """The cluster's replica slots as Ray's autoscaler reports them: [used, total], or None."""
    status = hook._send(_Request("GET", "/api/cluster_status")).json(dict)
    return status["data"]["clusterStatus"]["loadMetricsReport"]["usage"].get("replicaSlot")


def _wait_for_free_slots(hook: RayHook, total: int, timeout: float = 180) -> None:
    """Wait until no task or actor holds a replica slot: one per node only if both are free. (A slot
    still held by an earlier test's job once left this file's second replica unplaced.)"""
    deadline = time.monotonic() + timeout
    while True:
        usage = _slot_usage(hook)
        if usage == [0.0, float(total)]:
            return
        assert time.monotonic() < deadline, f"replica slots (used, total) still {usage} after {timeout} s"
        time.sleep(2)


def _placement(hook: RayHook, class_name: str, before: set[str]) -> dict[str, dict]:
    """Each new actor of ``class_name``: node, state, restarts and death cause (for a failure message)."""
    return {
        actor: {key: a.get(key) for key in ("node_id", "state", "num_restarts", "death_cause")}
        for actor, a in _actors(hook, class_name).items()
        if actor not in before
    }


def _most_slots_held_while_running(hook: RayHook, job_id: str) -> float:
    """Until the job ends: the most replica slots held at once. Each node has one, and each replica
    takes one, so two held is one replica placed on each node. (Read from the slots, not the state
    API's actor records: their node was empty for a replica alive on the head, and Ray clears a dead
    actor's address.)"""
    most = 0.0
    while not hook.get_job_status(job_id).is_terminal:
        most = max(most, (_slot_usage(hook) or [0.0])[0])
        time.sleep(1)
    return most


def _operator(tiny_model: Path, folder: Path, **overrides):
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "tickets.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"t{i:04d}", "text": f"ticket {i}"}) + "\n" for i in range(ROWS))
    )
    params = dict(
        messages_column=None,
        user_template="Classify: {text}",
        id_column="id",
        keep_columns=None,
        concurrency=(2, 2),  # a fixed pool: both replicas start at once
        replica_resources={"CPU": 1, REPLICA_SLOT: 1},  # one slot per node: one replica per node
        engine_kwargs=CPU_ENGINE_KWARGS,  # an explicit 1 GiB KV cache: no sizing pass, bounded memory
        output_format="parquet",
    )
    return make_operator(tiny_model, str(source), str(folder / "out"), **{**params, **overrides})


def _script_job(hook: RayHook, script: str) -> str:
    """Run ``script`` as a small Ray job of its own (the test process has no Ray); its job id."""
    import shlex
    import uuid

    return hook.submit_job(
        f"python -c {shlex.quote(script)}", submission_id=f"pool-probe-{uuid.uuid4().hex[:8]}"
    )


def _every_row_once(log: str) -> dict:
    manifest = manifest_from_log(log)
    assert manifest is not None
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (ROWS, ROWS, 0)
    ids = pq.read_table(manifest["outputs_uri"]).column("id").to_pylist()
    assert sorted(ids) == [f"t{i:04d}" for i in range(ROWS)]  # every row, exactly once
    return manifest


def test_two_replicas_one_per_node_every_row_once(two_nodes, tiny_model: Path, tmp_path: Path) -> None:
    hook = RayHook()
    before = set(_actors(hook, "vLLMEngineStage"))
    operator = _operator(tiny_model, tmp_path)
    job_id = submit_pipeline(operator, run_key="two-nodes", submission_id="raybatch-test-two-nodes")
    # A fixed pool of two: Ray Data starts both replicas before any row goes in, so both live (built,
    # placed) for a minute at least before the job ends, however fast its rows go.
    slots_held = _most_slots_held_while_running(hook, job_id)
    status = wait_for_job(job_id)
    log = hook.get_job_logs(job_id)
    assert status.value == "SUCCEEDED", log[-3000:]

    engines = _placement(hook, "vLLMEngineStage", before)
    assert len(engines) == 2, engines
    # one replica on each node, both at once
    assert slots_held == 2, (slots_held, engines, log[-3000:])
    _every_row_once(log)


def test_two_concurrent_jobs_share_a_warm_pool_of_two_replicas_one_per_node(
    two_nodes, tiny_model: Path, tmp_path: Path
) -> None:
    """Two dates at once (a backfill with max_active_runs=2) on one pool of two replicas: two engines in
    all, one per node, built side by side; each date commits every row once; then scale to zero."""
    hook = RayHook()
    before = set(_actors(hook, "EngineReplica"))
    jobs = {
        day: submit_pipeline(
            _operator(tiny_model, tmp_path / day, keep_warm_seconds=120, batch_size=8),
            run_key=f"two-nodes-pool-{day}",
            submission_id=f"raybatch-test-two-nodes-pool-{day}",
        )
        for day in ("day1", "day2")
    }
    pools = []
    for day, job_id in jobs.items():
        status = wait_for_job(job_id)
        log = hook.get_job_logs(job_id)
        assert status.value == "SUCCEEDED", f"{day}: {log[-3000:]}"
        pools.append(_every_row_once(log)["engine_pool"])

    replicas = {actor: a for actor, a in _actors(hook, "EngineReplica").items() if actor not in before}
    assert len(replicas) == 2, replicas  # one pool for both dates, not one each
    assert {a["node_id"] for a in replicas.values()} == {node.node_id for node in two_nodes}
    assert pools[0]["fingerprint"] == pools[1]["fingerprint"] and pools[0]["replicas"] == 2
    # Both replicas were built for the first date: each one's start-up is in its manifest, or, where the
    # date's rows were all done on the replica built first (a batch goes only to a built replica), that
    # the other was still building when it ended; how far apart they became ready where both were.
    timings = pools[0]["replica_timings"]
    assert [t["replica"] for t in timings] == [0, 1], timings
    built = [t["engine_ready_s"] for t in timings if t["answered"]]
    assert built and all(ready > 0 for ready in built), timings
    assert all(t["answered"] or t["building_at_job_end"] for t in timings), timings
    if len(built) == 2:
        assert pools[0]["replica_ready_skew_s"] == pytest.approx(max(built) - min(built), abs=0.002)
    else:
        assert pools[0]["replica_ready_skew_s"] is None

    # Replica 0 goes (a crash, say); a date that asks for one replica runs warm on replica 1 instead of
    # building replica 0 again (EnginePool.preferring_live), and its keep_warm_seconds=5 is the pool's now.
    [replica_0] = [a for a in replicas.values() if a.get("name", "").endswith(f"{pools[0]['fingerprint']}-0")]
    killed = _script_job(
        hook,
        f"import ray; ray.init(); ray.kill(ray.get_actor({replica_0['name']!r}, "
        "namespace='raybatch_engine_pool'), no_restart=True)",
    )
    assert wait_for_job(killed).value == "SUCCEEDED", hook.get_job_logs(killed)[-2000:]
    deadline = time.monotonic() + 60
    while _actors(hook, "EngineReplica")[replica_0["actor_id"]]["state"] != "DEAD":
        assert time.monotonic() < deadline, "replica 0 still alive 60 s after ray.kill"
        time.sleep(1)
    day3 = submit_pipeline(
        _operator(tiny_model, tmp_path / "day3", keep_warm_seconds=5, batch_size=8, concurrency=1),
        run_key="two-nodes-pool-day3",
        submission_id="raybatch-test-two-nodes-pool-day3",
    )
    status = wait_for_job(day3)
    log = hook.get_job_logs(day3)
    assert status.value == "SUCCEEDED", log[-3000:]
    third = _every_row_once(log)["engine_pool"]
    assert (third["fingerprint"], third["replicas"], third["warm_replicas"]) == (
        pools[0]["fingerprint"],
        1,
        1,
    )
    assert [t["replica"] for t in third["replica_timings"]] == [1]
    assert set(_actors(hook, "EngineReplica")) - before == set(replicas)  # no replica built for it

    # keep_warm_seconds=5, the last job's: the replicas end after the jobs, and their slots are free again.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = {
            actor: a["state"] for actor, a in _actors(hook, "EngineReplica").items() if actor in replicas
        }
        if set(states.values()) == {"DEAD"}:
            break
        time.sleep(2)
    assert set(states.values()) == {"DEAD"}, states
