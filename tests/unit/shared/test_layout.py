"""Tests of airflow_provider_raybatch/shared/layout.py: the replica layout, its fit check, the nodes
parser."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from airflow_provider_raybatch.shared.exceptions import ClusterLayoutError, RayHookError
from airflow_provider_raybatch.shared.layout import (
    CLUSTER_NODES_ENDPOINT,
    ClusterResources,
    LayoutPlan,
    NodeResources,
    cluster_resources_from_api,
    plan_layout,
)
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

# The body of GET /api/v0/nodes as Ray 2.60 writes it, produced without a cluster by Ray's own code:
# GcsNodeInfo protobufs -> StateAPIManager.list_nodes (state_aggregator.py) -> do_reply/rest_response.
# A CPU head, two 8 x H100 workers and a dead 4 x L4 worker. Not checked against a live head.
NODES_PAYLOAD: dict[str, Any] = {  # Any: JSON values.
    "result": True,
    "msg": "",
    "data": {
        "result": {
            "total": 4,
            "num_after_truncation": 4,
            "num_filtered": 4,
            "result": [
                {
                    "node_id": "01" * 28,
                    "node_ip": "10.0.0.1",
                    "is_head_node": True,
                    "state": "ALIVE",
                    "state_message": None,
                    "node_name": "10.0.0.1",
                    "resources_total": {
                        "CPU": 8.0,
                        "node:__internal_head__": 1.0,
                        "node:10.0.0.1": 1.0,
                        "memory": 24000000000.0,
                        "object_store_memory": 7000000000.0,
                    },
                    "labels": {"ray.io/node-id": "01" * 28},
                },
                {
                    "node_id": "02" * 28,
                    "node_ip": "10.0.0.2",
                    "is_head_node": False,
                    "state": "ALIVE",
                    "state_message": None,
                    "node_name": "10.0.0.2",
                    "resources_total": {
                        "CPU": 96.0,
                        "accelerator_type:H100": 1.0,
                        "GPU": 8.0,
                        "memory": 900000000000.0,
                        "object_store_memory": 200000000000.0,
                        "node:10.0.0.2": 1.0,
                    },
                    "labels": {
                        "ray.io/node-id": "02" * 28,
                        "ray.io/accelerator-type": "H100",
                        "ray.io/node-group": "gpu-h100",
                    },
                },
                {
                    "node_id": "03" * 28,
                    "node_ip": "10.0.0.3",
                    "is_head_node": False,
                    "state": "ALIVE",
                    "state_message": None,
                    "node_name": "10.0.0.3",
                    "resources_total": {
                        "CPU": 96.0,
                        "accelerator_type:H100": 1.0,
                        "node:10.0.0.3": 1.0,
                        "GPU": 8.0,
                        "memory": 900000000000.0,
                        "object_store_memory": 200000000000.0,
                    },
                    "labels": {
                        "ray.io/node-id": "03" * 28,
                        "ray.io/accelerator-type": "H100",
                        "ray.io/node-group": "gpu-h100",
                    },
                },
                {
                    "node_id": "04" * 28,
                    "node_ip": "10.0.0.4",
                    "is_head_node": False,
                    "state": "DEAD",
                    "state_message": None,
                    "node_name": "10.0.0.4",
                    "resources_total": {"CPU": 48.0, "accelerator_type:L4": 1.0, "GPU": 4.0},
                    "labels": {"ray.io/node-id": "04" * 28, "ray.io/accelerator-type": "L4"},
                },
            ],
            "partial_failure_warning": "",
            "warnings": None,
        }
    },
}
BASE = {"model": "m", "input_uri": "s3://b/in.csv", "output_uri": "s3://b/out", "user_template": "{x}"}


def plan(**params: Any) -> LayoutPlan:  # Any: spec parameters.
    return plan_layout(BatchInferenceSpec.build(**BASE, **params))


def nodes(*shapes: dict[str, float], accelerator: str | None = None) -> ClusterResources:
    return ClusterResources(
        tuple(NodeResources(f"n{i}", shape, accelerator_type=accelerator) for i, shape in enumerate(shapes))
    )


@pytest.fixture
def cluster() -> ClusterResources:
    return cluster_resources_from_api(NODES_PAYLOAD)


# --- the plan and its one-line description ---------------------------------------------------------


def test_describe_names_replicas_gpus_accelerator_and_batches_in_flight() -> None:
    layout = plan(
        concurrency=2,
        engine_kwargs={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
        accelerator_type="H100",
        batch_size=64,
        max_concurrent_batches=8,
    )

    assert layout.describe() == (
        "2 replicas x 4 GPUs each (TP 2 x PP 2), 8 GPUs in all; accelerator H100; "
        "batch_size 64, max_concurrent_batches 8 → up to 16 batches in flight (1024 rows)"
    )


def test_describe_defaults_to_one_gpu_and_ray_data_llms_max_concurrent_batches() -> None:
    assert plan(batch_size=32).describe() == (
        "1 replica x 1 GPU each (TP 1 x PP 1), 1 GPU in all; accelerator any; "
        "batch_size 32, max_concurrent_batches 8 (Ray Data LLM's default) → up to 8 batches in flight "
        "(256 rows)"
    )


def test_describe_shows_the_range_of_an_autoscaling_pool() -> None:
    text = plan(
        concurrency=(2, 4), engine_kwargs={"tensor_parallel_size": 2}, max_concurrent_batches=4
    ).describe()

    assert text.startswith("2-4 replicas x 2 GPUs each (TP 2 x PP 1), 4-8 GPUs in all;")
    assert text.endswith("→ up to 16 batches in flight (1024 rows)")


def test_describe_shows_explicit_replica_resources() -> None:
    text = plan(replica_resources={"CPU": 1}, concurrency=2).describe()

    assert text.startswith("2 replicas x 1 CPU each (replica_resources), 2 CPUs in all; accelerator any;")


def test_gpus_per_replica_is_tensor_times_pipeline_parallel_size() -> None:
    layout = plan(engine_kwargs={"tensor_parallel_size": 4, "pipeline_parallel_size": 2})

    assert layout.workers == 8
    assert layout.gpus_per_replica == 8
    assert len(layout.replica_bundles) == 8
    assert layout.replica_resources == {"GPU": 8.0, "CPU": 8.0}


def test_replica_resources_is_one_bundle() -> None:
    layout = plan(replica_resources={"CPU": 2, "GPU": 1})

    assert layout.replica_bundles == ({"CPU": 2.0, "GPU": 1.0},)
    assert layout.explicit_replica_resources


# --- check_fits --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"concurrency": 16, "accelerator_type": "H100"},
        {"concurrency": (2, 64), "engine_kwargs": {"tensor_parallel_size": 8}},
        # PP spreads one replica over both 8-GPU nodes: each stage's TP 8 stays on one node.
        {"engine_kwargs": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}},
        {"engine_kwargs": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, "concurrency": 4},
        {"replica_resources": {"CPU": 96}, "concurrency": 2},
    ],
)
def test_layouts_that_fit(cluster: ClusterResources, params: dict[str, Any]) -> None:
    plan(**params).check_fits(cluster)


@pytest.mark.parametrize(
    ("params", "parameter", "fragments"),
    [
        (
            {"accelerator_type": "A100"},
            "accelerator_type",
            ["accelerator_type='A100' is on no node", "accelerator types present: H100"],
        ),
        (
            {"engine_kwargs": {"tensor_parallel_size": 16}},
            "engine_kwargs.tensor_parallel_size",
            ["needs 16 GPUs on one node", "tensor parallelism cannot span nodes", "GPU 8 (H100)"],
        ),
        (
            {"engine_kwargs": {"tensor_parallel_size": 16, "pipeline_parallel_size": 2}},
            "engine_kwargs.tensor_parallel_size",
            ["each of the 2 pipeline stages", "raise pipeline_parallel_size"],
        ),
        (
            {"concurrency": 17},
            "concurrency",
            ["concurrency=17 needs 17 replicas x (1 GPU + 1 CPU)", "17 GPUs but the cluster has 16 GPUs"],
        ),
        (
            {
                "concurrency": (3, 8),
                "engine_kwargs": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
            },
            "concurrency",
            ["concurrency=(3, 8) needs 3 replicas", "24 GPUs but the cluster has 16 GPUs"],
        ),
        (
            {"replica_resources": {"CPU": 128}},
            "replica_resources",
            ["replica_resources={'CPU': 128.0} is one bundle and must fit on one node", "CPU 96"],
        ),
    ],
)
def test_layouts_that_do_not_fit_name_the_parameter(
    cluster: ClusterResources, params: dict[str, Any], parameter: str, fragments: list[str]
) -> None:
    with pytest.raises(ClusterLayoutError) as raised:
        plan(**params).check_fits(cluster)

    assert raised.value.parameter == parameter
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert "3 nodes: 1 x CPU 8 [head]; 2 x CPU 96, GPU 8 (H100)" in str(raised.value)


def test_the_minimum_of_an_autoscaling_pool_is_what_must_fit() -> None:
    one_node = nodes({"CPU": 16, "GPU": 2})

    plan(concurrency=(2, 10)).check_fits(one_node)
    with pytest.raises(ClusterLayoutError, match=r"concurrency=\(3, 10\) needs 3 replicas"):
        plan(concurrency=(3, 10)).check_fits(one_node)


def test_a_plain_int_concurrency_must_fit_whole() -> None:
    with pytest.raises(ClusterLayoutError, match="concurrency=3 needs 3 replicas"):
        plan(concurrency=3).check_fits(nodes({"CPU": 16, "GPU": 2}))


def test_replicas_sharing_one_gpu_fit_by_their_fraction_of_it() -> None:
    """A small model's replicas share a GPU (docs/howto-parallelism.md, "Small models"): four quarters
    fit one GPU, a fifth does not, and the plan says a quarter of a GPU each."""
    quarter = {"GPU": 0.25, "CPU": 1}
    one_gpu = nodes({"CPU": 16, "GPU": 1})
    plan(concurrency=4, replica_resources=quarter).check_fits(one_gpu)
    assert "4 replicas" in plan(concurrency=4, replica_resources=quarter).describe()
    with pytest.raises(ClusterLayoutError, match="concurrency=5 needs 5 replicas"):
        plan(concurrency=5, replica_resources=quarter).check_fits(one_gpu)


def test_replicas_split_over_nodes_count_per_node_not_in_total() -> None:
    # 9 GPUs in all, but each 3-GPU node holds one 2-GPU replica: 3 replicas, not 4.
    three_nodes = nodes({"CPU": 8, "GPU": 3}, {"CPU": 8, "GPU": 3}, {"CPU": 8, "GPU": 3})
    layout = plan(engine_kwargs={"tensor_parallel_size": 2}, concurrency=4)

    with pytest.raises(
        ClusterLayoutError, match="enough in all, but split over its nodes they hold 3 replicas"
    ):
        layout.check_fits(three_nodes)
    plan(engine_kwargs={"tensor_parallel_size": 2}, concurrency=3).check_fits(three_nodes)


def test_only_nodes_of_the_accelerator_type_count() -> None:
    mixed = ClusterResources(
        (
            NodeResources("a", {"CPU": 32, "GPU": 8}, accelerator_type="L4"),
            NodeResources("b", {"CPU": 32, "GPU": 2}, accelerator_type="H100"),
        )
    )

    plan(concurrency=2, accelerator_type="H100").check_fits(mixed)
    with pytest.raises(ClusterLayoutError, match="3 GPUs but the cluster has 2 GPUs on H100 nodes"):
        plan(concurrency=3, accelerator_type="H100").check_fits(mixed)


def test_a_cpu_cluster_fits_replica_resources_but_not_the_gpu_default() -> None:
    cpu_only = nodes({"CPU": 8})

    plan(replica_resources={"CPU": 1}, concurrency=8).check_fits(cpu_only)
    with pytest.raises(
        ClusterLayoutError, match="needs 1 GPU per replica .* but the cluster has no GPU"
    ) as raised:
        plan().check_fits(cpu_only)
    assert raised.value.parameter == "replica_resources"
    assert "replica_resources={'CPU': 1}" in str(raised.value)


def test_an_empty_cluster_fits_nothing() -> None:
    with pytest.raises(ClusterLayoutError, match="no alive nodes"):
        plan().check_fits(ClusterResources(()))


# --- the dashboard's answer --------------------------------------------------------------------------


def test_endpoint_is_the_state_apis_node_list() -> None:
    assert CLUSTER_NODES_ENDPOINT.split("?")[0] == "/api/v0/nodes"


def test_parses_alive_nodes_with_resources_and_accelerator(cluster: ClusterResources) -> None:
    assert [node.node_id[:2] for node in cluster.nodes] == ["01", "02", "03"]  # the dead L4 node is gone
    head, worker = cluster.nodes[0], cluster.nodes[1]
    assert head.is_head and head.accelerator_type is None and head.resources["CPU"] == 8
    assert not worker.is_head and worker.accelerator_type == "H100" and worker.resources["GPU"] == 8
    assert cluster.accelerator_types == ["H100"]
    assert cluster.total("GPU") == 16
    assert cluster.total("GPU", "L4") == 0
    assert cluster.describe() == "3 nodes: 1 x CPU 8 [head]; 2 x CPU 96, GPU 8 (H100)"


def test_accelerator_type_falls_back_to_the_node_label() -> None:
    payload = copy.deepcopy(NODES_PAYLOAD)
    row = payload["data"]["result"]["result"][1]
    del row["resources_total"]["accelerator_type:H100"]

    assert cluster_resources_from_api(payload).nodes[1].accelerator_type == "H100"


def test_round_trips_through_json_text() -> None:
    parsed = cluster_resources_from_api(json.loads(json.dumps(NODES_PAYLOAD)))

    assert len(parsed.nodes) == 3


def test_an_error_answer_raises_with_rays_message() -> None:
    with pytest.raises(RayHookError, match="GET /api/v0/nodes answered with an error: Failed to query GCS"):
        cluster_resources_from_api({"result": False, "msg": "Failed to query GCS", "data": {}})


@pytest.mark.parametrize(
    "payload", [{}, {"data": {"result": None}}, {"data": {"result": {"result": [1]}}}, []]
)
def test_an_unexpected_shape_raises_a_hook_error(payload: Any) -> None:  # Any: malformed on purpose.
    with pytest.raises(RayHookError, match="unexpected shape"):
        cluster_resources_from_api(payload)


def test_importing_the_layout_loads_no_ray() -> None:
    code = (
        "import sys, airflow_provider_raybatch.shared.layout\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'torch', 'pyarrow')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"
