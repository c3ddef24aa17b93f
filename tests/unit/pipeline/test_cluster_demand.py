"""What Ray waits to place, read from a stand-in of the autoscaler SDK's cluster status."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_raybatch.pipeline.generate import cluster_demand


def _request(bundle: dict[str, float], count: int = 1) -> SimpleNamespace:
    return SimpleNamespace(bundle=bundle, count=count)


def _node(node_id: str, total: dict[str, float]) -> SimpleNamespace:
    usage = [SimpleNamespace(resource_name=name, total=amount, used=amount) for name, amount in total.items()]
    return SimpleNamespace(node_id=node_id, resource_usage=SimpleNamespace(usage=usage))


def _group(strategy: str, *requests: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(strategy=strategy, bundles_by_count=list(requests))


def _status(*groups: SimpleNamespace, gpus: float = 2) -> SimpleNamespace:
    """A node of ``gpus`` GPUs (all in use), a task waiting for a GPU, a placed request (count 0), and
    the placement ``groups`` waiting."""
    demands = SimpleNamespace(
        ray_task_actor_demand=[
            SimpleNamespace(bundles_by_count=[_request({"CPU": 1, "GPU": 1}), _request({"GPU": 8}, 0)])
        ],
        placement_group_demand=list(groups),
    )
    return SimpleNamespace(
        resource_demands=demands,
        active_nodes=[_node("n1", {"CPU": 8, "GPU": gpus, "slot": 4})],
        idle_nodes=[],
    )


@pytest.fixture
def status(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """:func:`_status` with one PACK group waiting for 2 slots."""
    status = _status(_group("PACK", _request({"slot": 2})))
    monkeypatch.setattr(cluster_demand, "cluster_status", lambda: status)
    return status


def test_waiting_bundles_are_tasks_and_actors_then_placement_groups(status: SimpleNamespace) -> None:
    assert cluster_demand.waiting_bundles(status) == [{"CPU": 1, "GPU": 1}, {"slot": 2}]
    assert cluster_demand.waiting_bundles(status, placement_groups=False) == [{"CPU": 1, "GPU": 1}]


def test_an_actor_waits_for_what_a_waiting_task_or_actor_asks_for_at_least(status: SimpleNamespace) -> None:
    assert cluster_demand.actor_waits_for({"GPU": 1})
    assert not cluster_demand.actor_waits_for({"GPU": 2})  # the one asking for 8 is placed
    assert not cluster_demand.actor_waits_for({"slot": 1})  # a placement group's bundle is no actor


def test_when_ray_cannot_say_the_caller_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_demand, "cluster_status", lambda: None)

    assert cluster_demand.actor_waits_for({"GPU": 1})
    assert not cluster_demand.actor_waits_for({"GPU": 1}, when_unknown=False)


@pytest.mark.parametrize(
    ("group", "gpus", "judged"),
    [
        # STRICT_PACK: its bundles summed, all on one node, and only where a node could hold them.
        (_group("STRICT_PACK", _request({"GPU": 1}, 2)), 2, [{"GPU": 2.0}]),
        (_group("STRICT_PACK", _request({"GPU": 1}, 2)), 1, []),
        # STRICT_SPREAD: one bundle a node, so two bundles never fit one node.
        (_group("STRICT_SPREAD", _request({"GPU": 1}, 2)), 2, []),
        (_group("STRICT_SPREAD", _request({"GPU": 1})), 2, [{"GPU": 1}]),
        (_group("PACK", _request({"GPU": 1}, 2)), 2, [{"GPU": 1}, {"GPU": 1}]),
        # Any strategy: more than the whole cluster has is never placed.
        (_group("PACK", _request({"GPU": 1}, 100)), 8, []),
        (_group("SPREAD", _request({"GPU": 1}, 2)), 1, []),
    ],
)
def test_a_placement_group_is_judged_by_its_strategy(
    group: SimpleNamespace, gpus: float, judged: list[dict[str, float]]
) -> None:
    assert cluster_demand.waiting_bundles(_status(group, gpus=gpus))[1:] == judged


def test_a_strict_spread_group_needs_a_node_of_its_own_for_each_bundle() -> None:
    # Two GPU bundles and a CPU one over one GPU node and two CPU nodes: three nodes for three bundles,
    # but only one of them can host a GPU bundle. Ray never places it.
    status = _status(_group("STRICT_SPREAD", _request({"GPU": 1}, 2), _request({"CPU": 1})), gpus=8)
    status.idle_nodes = [_node("c1", {"CPU": 8}), _node("c2", {"CPU": 8})]
    assert cluster_demand.waiting_bundles(status)[1:] == []

    status.idle_nodes.append(_node("g2", {"CPU": 8, "GPU": 8}))
    assert cluster_demand.waiting_bundles(status)[1:] == [{"GPU": 1}, {"GPU": 1}, {"CPU": 1}]


def test_a_placement_group_ray_will_never_place_ends_no_idle_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    status = _status(_group("STRICT_SPREAD", _request({"GPU": 1}, 2)))
    status.resource_demands.ray_task_actor_demand = []
    monkeypatch.setattr(cluster_demand, "cluster_status", lambda: status)

    assert cluster_demand.work_it_would_place("n1", {"CPU": 1, "GPU": 1}) is None

    status.resource_demands.placement_group_demand = [_group("STRICT_PACK", _request({"GPU": 1}, 2))]
    assert cluster_demand.work_it_would_place("n1", {"CPU": 1, "GPU": 1}) == {"GPU": 2.0}
