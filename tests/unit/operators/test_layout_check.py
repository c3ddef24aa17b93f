"""The operator logs the planned layout and refuses, before submitting, one the cluster cannot host."""

from __future__ import annotations

import pytest
import respx

from airflow_provider_raybatch.shared.exceptions import ClusterLayoutError
from tests.unit.conftest import nodes_payload
from tests.unit.operators.test_llm_batch import FakeTI, make_operator


def _empty_listing(ray_api: respx.MockRouter) -> respx.Route:
    ray_api.get("/api/jobs/").respond(json=[])
    return ray_api.post("/api/jobs/").respond(json={"submission_id": "x"})


def test_layout_that_cannot_fit_is_refused_before_submitting(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    ray_api.get("/api/v0/nodes").respond(json=nodes_payload({"CPU": 16.0, "GPU": 2.0}))
    submit = _empty_listing(ray_api)
    op = make_operator(ray_conn_id=ray_conn, engine_kwargs={"tensor_parallel_size": 4})

    with pytest.raises(ClusterLayoutError) as raised:
        op.execute({"ti": FakeTI()})

    assert raised.value.parameter == "engine_kwargs.tensor_parallel_size"
    assert "tensor_parallel_size=4 needs 4 GPUs on one node" in str(raised.value)
    assert not submit.called


def test_cpu_cluster_without_replica_resources_is_told_what_to_set(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    ray_api.get("/api/v0/nodes").respond(json=nodes_payload({"CPU": 8.0}))
    submit = _empty_listing(ray_api)

    with pytest.raises(ClusterLayoutError, match=r"replica_resources=\{'CPU': 1\}"):
        make_operator(ray_conn_id=ray_conn).execute({"ti": FakeTI()})
    assert not submit.called


def test_layout_check_can_be_turned_off_for_autoscaling_clusters(
    ray_conn: str, ray_api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = ray_api.get("/api/v0/nodes").respond(json=nodes_payload({"CPU": 8.0}))  # GPU group at zero
    ray_api.route(method="GET", path__startswith="/api/packages/gcs/").respond(404)
    ray_api.route(method="PUT", path__startswith="/api/packages/gcs/").respond(200)
    submit = _empty_listing(ray_api)
    op = make_operator(ray_conn_id=ray_conn, check_layout=False, concurrency=(1, 4), deferrable=False)
    ray_api.get("/api/jobs/x").respond(
        json={"submission_id": "x", "status": "FAILED", "message": "stop here"}
    )
    ray_api.get("/api/jobs/x/logs").respond(json={"logs": ""})

    with pytest.raises(Exception, match="stop here"):
        op.execute({"ti": FakeTI()})

    assert submit.called and not nodes.called
    task_log = "".join(capsys.readouterr())  # the operator's log goes through Airflow's structlog
    assert "Planned layout: 1-4 replicas x 1 GPU each (TP 1 x PP 1)" in task_log, task_log[-2000:]
