"""Two nodes on one machine (the head and a worker raylet of its own): two engine replicas, one per
node, through Ray's own scheduling; the output is complete and has every row exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import RayHook, _Request
from airflow_provider_raybatch.manifest import manifest_from_log
from tests.conftest import REPLICA_SLOT, submit_pipeline, wait_for_job
from tests.integration.test_pipeline_job import make_operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROWS = 240


def _engine_actor_nodes(hook: RayHook, job_hex: str | None = None) -> dict[str, str]:
    """actor id -> node id of every vLLM engine replica the cluster has run (the state API)."""
    payload = hook._send(_Request("GET", "/api/v0/actors?detail=true&limit=10000")).json()
    actors = payload["data"]["result"]["result"]
    return {a["actor_id"]: a["node_id"] for a in actors if "vLLMEngineStage" in (a.get("class_name") or "")}


def test_two_replicas_one_per_node_every_row_once(ray_connection, tiny_model: Path, tmp_path: Path) -> None:
    hook = RayHook()
    ray_connection.add_worker_node(num_cpus=4, resources={REPLICA_SLOT: 1})
    nodes = hook.get_cluster_resources().nodes
    assert len(nodes) == 2, nodes
    before = set(_engine_actor_nodes(hook))

    source = tmp_path / "tickets.jsonl"
    source.write_text(
        "".join(json.dumps({"id": f"t{i:04d}", "text": f"ticket {i}"}) + "\n" for i in range(ROWS))
    )
    operator = make_operator(
        tiny_model, str(source), str(tmp_path / "out"),
        messages_column=None, user_template="Classify: {text}", id_column="id", keep_columns=None,
        concurrency=(2, 2),  # a fixed pool: both replicas start at once
        replica_resources={"CPU": 1, REPLICA_SLOT: 1},  # one slot per node: one replica per node
        engine_kwargs={"max_model_len": 512, "gpu_memory_utilization": 0.1, "enforce_eager": True},
        output_format="parquet",
    )  # fmt: skip

    job_id = submit_pipeline(operator, run_key="two-nodes", submission_id="raybatch-test-two-nodes")
    status = wait_for_job(job_id)
    log = hook.get_job_logs(job_id)
    assert status.value == "SUCCEEDED", log[-3000:]

    engines = {actor: node for actor, node in _engine_actor_nodes(hook).items() if actor not in before}
    assert len(engines) == 2, engines
    assert set(engines.values()) == {node.node_id for node in nodes}  # one replica on each node

    manifest = manifest_from_log(log)
    assert manifest is not None
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (ROWS, ROWS, 0)
    ids = pq.read_table(manifest["outputs_uri"]).column("id").to_pylist()
    assert sorted(ids) == [f"t{i:04d}" for i in range(ROWS)]  # every row, exactly once
