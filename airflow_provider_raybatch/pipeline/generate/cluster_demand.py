"""What Ray's scheduler waits to place, and what each node has free: the GCS's view the autoscaler reads.

A warm pool's replica holds its resources between jobs (a GPU, say, and a CPU). Two kinds of work
may wait for them: a job of ours on other engines (it asks idle replicas to end,
:func:`.engine_pool.make_room`) and work that knows nothing of pools (another team's Ray job, a Ray
Data pipeline, the Batch API's jobs). For the second, an idle replica looks itself
(:meth:`.pool_replica.EngineReplica._give_way`) with :func:`work_it_would_place`: a pool kept warm for
a day must not hold a cluster's GPUs against them.

The figures come from Ray's autoscaler SDK (``ray.autoscaler.v2.sdk.get_cluster_status``): resource
demands are the task, actor and placement-group bundles Ray could not place, and each node's usage is
what its raylet last reported (a second or so behind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.autoscaler.v2.schema import ClusterStatus, PlacementGroupResourceDemand

#: Resources by Ray's names (``CPU``, ``GPU``, ``accelerator_type:H100``, custom ones) -> amount.
Resources = dict[str, float]
#: Node id (hex) -> (its total resources, those free now).
NodeResources = dict[str, tuple[Resources, Resources]]

#: The node key of a make-room call's ``lacking`` where Ray gave no per-node figures: the cluster's
#: totals stand for one node (:func:`.engine_pool.make_room`).
ANY_NODE = "*"
#: Resources every replica holds a little of, which alone are no reason for an idle one to end: a GPU
#: engine's one CPU would otherwise go for any task queued behind a busy cluster, and the engine with it.
PLENTIFUL = frozenset({"CPU", "memory", "object_store_memory"})
#: How long a look at the GCS waits for its answer.
_STATUS_TIMEOUT_SECONDS = 2


def cluster_status() -> ClusterStatus | None:
    """The GCS's view of the cluster now; None where Ray cannot say (another Ray layout, no answer)."""
    import ray

    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        return get_cluster_status(ray.get_runtime_context().gcs_address, timeout=_STATUS_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - another Ray layout, or the GCS did not answer
        return None


def node_resources(status: ClusterStatus | None) -> NodeResources:
    """Each alive node's resources in ``status`` (none where it is None)."""
    nodes: NodeResources = {}
    if status is None:
        return nodes
    for node in [*status.active_nodes, *status.idle_nodes]:
        if node.node_id and node.resource_usage is not None:
            usage = node.resource_usage.usage
            total = {use.resource_name: use.total for use in usage}
            nodes[node.node_id] = (total, {use.resource_name: use.total - use.used for use in usage})
    return nodes


def node_resources_now() -> NodeResources:
    """Each alive node's resources now; where Ray cannot say, the cluster's totals as one node
    (:data:`ANY_NODE`)."""
    import ray

    return node_resources(cluster_status()) or {
        ANY_NODE: (ray.cluster_resources(), ray.available_resources())
    }


def waiting_bundles(status: ClusterStatus, placement_groups: bool = True) -> list[Resources]:
    """The bundles Ray waits to place: each waiting task's or actor's, and (``placement_groups``) those
    of each waiting placement group that its nodes could ever place (:func:`_group_bundles`)."""
    demands = status.resource_demands
    bundles = [
        dict(request.bundle)
        for demand in demands.ray_task_actor_demand
        for request in demand.bundles_by_count
        if request.count
    ]
    if placement_groups:
        nodes = [total for total, _ in node_resources(status).values()]
        bundles += [
            bundle for group in demands.placement_group_demand for bundle in _group_bundles(group, nodes)
        ]
    return bundles


def _group_bundles(group: PlacementGroupResourceDemand, nodes: list[Resources]) -> list[Resources]:
    """What a waiting placement group needs of one node, by its strategy: a STRICT_PACK group its
    bundles summed (all on one node), a STRICT_SPREAD group each bundle (one a node); none where no set
    of ``nodes`` (their totals) could ever place it (more than the cluster has in all, too), so that
    work Ray will never place ends nothing. Other strategies: each bundle (a lower bound of what a
    packed group needs of a node)."""
    bundles = [dict(request.bundle) for request in group.bundles_by_count for _ in range(request.count)]
    if not bundles:
        return []
    summed = _summed(bundles)
    if nodes and short_of(summed, _summed(nodes)):
        return []  # more than the whole cluster has, whatever the strategy
    if group.strategy == "STRICT_PACK":
        return [summed] if not nodes or any(not short_of(summed, total) for total in nodes) else []
    if group.strategy == "STRICT_SPREAD" and nodes:
        return bundles if _one_node_each(bundles, nodes) else []
    return bundles


def _one_node_each(bundles: list[Resources], nodes: list[Resources]) -> bool:
    """Whether each bundle can have a node of its own whose totals cover it (a matching of bundles to
    nodes, by augmenting paths: a group's bundles and a cluster's nodes are few)."""
    hosts = [[node for node, total in enumerate(nodes) if not short_of(bundle, total)] for bundle in bundles]
    holder: dict[int, int] = {}  # node -> the bundle it hosts

    def place(bundle: int, tried: set[int]) -> bool:
        for node in hosts[bundle]:
            if node not in tried:
                tried.add(node)
                if node not in holder or place(holder[node], tried):
                    holder[node] = bundle
                    return True
        return False

    return len(bundles) <= len(nodes) and all(place(bundle, set()) for bundle in range(len(bundles)))


def _summed(resources: list[Resources]) -> Resources:
    summed: Resources = {}
    for one in resources:
        for name, amount in one.items():
            summed[name] = summed.get(name, 0.0) + amount
    return summed


def actor_waits_for(needs: Resources, when_unknown: bool = True) -> bool:
    """Whether Ray's scheduler has a task or actor asking for at least ``needs`` that it cannot place
    now; ``when_unknown`` if Ray cannot say (True for a lease, so that making room stays its way out
    of a full cluster)."""
    status = cluster_status()
    if status is None:
        return when_unknown
    return any(
        all(bundle.get(name, 0.0) >= amount for name, amount in needs.items() if amount)
        for bundle in waiting_bundles(status, placement_groups=False)
    )


def lacking_by_node(needs: Resources, nodes: NodeResources) -> dict[str, list[str]]:
    """For each node that could host a bundle needing ``needs`` (its totals cover them), the resources
    it lacks now; a node with an empty list has room. A bundle is placed on one node: the cluster's
    sum says nothing (half a GPU free on each of two nodes is no room for one GPU)."""
    return {
        node: short_of(needs, free) for node, (total, free) in nodes.items() if not short_of(needs, total)
    }


def short_of(needs: Resources, available: Resources) -> list[str]:
    """The resources of ``needs`` that ``available`` has too little of."""
    return sorted(name for name, amount in needs.items() if amount and available.get(name, 0.0) < amount)


def would_make_room(lacking: dict[str, list[str]], node_id: str, held: Resources) -> bool:
    """Whether a replica on ``node_id`` holding ``held`` would, once ended, free some of each resource
    its node lacks for a waiting bundle (``lacking``: :func:`lacking_by_node`)."""
    short = lacking.get(node_id, lacking.get(ANY_NODE))
    return short is not None and all(held.get(name, 0.0) > 0 for name in short)


def work_it_would_place(node_id: str, held: Resources) -> Resources | None:
    """A bundle Ray waits to place that ``node_id`` could host (its totals cover it), lacks some of
    now, more than CPUs or memory (:data:`PLENTIFUL`), and would have some of each of that once
    ``held`` is free; None if there is none, or Ray cannot say. A bundle no node of the cluster could
    ever host, or one that waits for what another node or another resource lacks, is not a reason to
    end anything here."""
    status = cluster_status()
    if status is None:
        return None
    node = node_resources(status).get(node_id)
    if node is None:
        return None
    for bundle in waiting_bundles(status):
        lacking = lacking_by_node(bundle, {node_id: node})
        scarce = set(lacking.get(node_id, ())) - PLENTIFUL
        if scarce and would_make_room(lacking, node_id, held):
            return bundle
    return None
