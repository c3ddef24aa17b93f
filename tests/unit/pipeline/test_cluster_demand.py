"""What Ray waits to place, read from a stand-in of the autoscaler SDK's cluster status."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_raybatch.pipeline.generate import cluster_demand


def _request(bundle: dict[str, float], count: int = 1) -> SimpleNamespace:
    return SimpleNamespace(bundle=bundle, count=count)


@pytest.fixture
def status(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A task waiting for a GPU, a placed request (count 0) and a placement group waiting for 2 slots."""
    demands = SimpleNamespace(
        ray_task_actor_demand=[
            SimpleNamespace(bundles_by_count=[_request({"CPU": 1, "GPU": 1}), _request({"GPU": 8}, 0)])
        ],
        placement_group_demand=[SimpleNamespace(bundles_by_count=[_request({"slot": 2})])],
    )
    status = SimpleNamespace(resource_demands=demands)
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
