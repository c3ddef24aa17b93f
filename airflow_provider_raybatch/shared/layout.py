"""Plan where a batch job's vLLM replicas go on a Ray cluster, and check that they fit, before submitting.

Pure Python, no ray import: the Airflow side runs this against the dashboard's answer, so a job that
could never be scheduled fails at once with a message that names the parameter, instead of waiting
in Ray's queue until the task times out.

The sizing rules are Ray Data LLM's (``vllm_engine_stage.py``, Ray 2.57 to 2.60):

- one engine replica runs ``tensor_parallel_size x pipeline_parallel_size`` vLLM workers, each
  reserving a ``{"GPU": 1, "CPU": 1}`` bundle (PACK), so a replica needs TP x PP GPUs;
- tensor parallelism does not cross nodes: with PP == 1 a replica's GPUs sit on one node, with
  PP > 1 each pipeline stage's TP GPUs do (vLLM's Ray executor places stages on other nodes);
- ``replica_resources`` replaces that with one explicit bundle per replica (vLLM's CPU build);
- ``accelerator_type`` pins every bundle to nodes carrying the ``accelerator_type:<type>`` resource;
- each replica works on up to ``max_concurrent_batches`` batches of ``batch_size`` rows at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.exceptions import ClusterLayoutError, RayHookError
from airflow_provider_raybatch.shared.json_types import JsonValue

if TYPE_CHECKING:
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: The dashboard's state API listing every node with ``resources_total`` and ``labels`` (Ray 2.60).
#: The default page is 100 nodes; 10,000 is the API server's own cap.
CLUSTER_NODES_ENDPOINT = "/api/v0/nodes?limit=10000"
#: Ray Data LLM's ``max_concurrent_batches`` when the spec leaves it unset (Ray 2.57 to 2.60).
DEFAULT_MAX_CONCURRENT_BATCHES = 8
#: The resource Ray gives a node whose accelerator type it detected, e.g. ``accelerator_type:H100``.
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
#: The node label carrying the same type (a default label in Ray 2.60).
ACCELERATOR_LABEL = "ray.io/accelerator-type"
#: What Ray Data LLM reserves per vLLM worker when no placement group config is given.
DEFAULT_WORKER_BUNDLE: Mapping[str, float] = {"GPU": 1.0, "CPU": 1.0}
# Resources a bundle may ask for that the fit check does not count (memory is not reserved here).
_CHECKED_RESOURCES_SKIP = frozenset({"memory", "object_store_memory"})


@dataclass(frozen=True)
class NodeResources:
    """One alive node: its total logical resources and accelerator type."""

    node_id: str
    resources: Mapping[str, float]
    accelerator_type: str | None = None
    is_head: bool = False

    def capacity_for(self, need: Mapping[str, float]) -> float:
        """How many copies of ``need`` this node could hold, as a fraction (0.5: half of one)."""
        ratios = [
            self.resources.get(name, 0.0) / amount
            for name, amount in need.items()
            if amount > 0 and name not in _CHECKED_RESOURCES_SKIP
        ]
        return min(ratios) if ratios else 0.0

    def units_of(self, need: Mapping[str, float]) -> int:
        """How many whole copies of ``need`` fit on this node at once."""
        return int(self.capacity_for(need) + 1e-9)

    def describe(self) -> str:
        """``CPU 96, GPU 8 (H100)``: the scheduling resources, not memory or node: markers."""
        shown = [
            f"{name} {_amount(self.resources[name])}" for name in ("CPU", "GPU") if name in self.resources
        ]
        text = ", ".join(shown) or "no CPU or GPU"
        if self.accelerator_type:
            text += f" ({self.accelerator_type})"
        return text + (" [head]" if self.is_head else "")


@dataclass(frozen=True)
class ClusterResources:
    """The alive nodes of a Ray cluster, as :func:`cluster_resources_from_api` reads them."""

    nodes: tuple[NodeResources, ...]

    @property
    def accelerator_types(self) -> list[str]:
        """The accelerator types present on any node, sorted."""
        return sorted({node.accelerator_type for node in self.nodes if node.accelerator_type})

    def eligible(self, accelerator_type: str | None) -> tuple[NodeResources, ...]:
        """The nodes a bundle pinned to ``accelerator_type`` (or to none) may be placed on."""
        if accelerator_type is None:
            return self.nodes
        return tuple(node for node in self.nodes if node.accelerator_type == accelerator_type)

    def total(self, name: str, accelerator_type: str | None = None) -> float:
        """The sum of one resource over the eligible nodes."""
        return sum(node.resources.get(name, 0.0) for node in self.eligible(accelerator_type))

    def describe(self) -> str:
        """``2 nodes: 1 x CPU 8 [head]; 1 x CPU 96, GPU 8 (H100)``."""
        groups: dict[str, int] = {}
        for node in self.nodes:
            groups[node.describe()] = groups.get(node.describe(), 0) + 1
        shapes = "; ".join(f"{count} x {shape}" for shape, count in groups.items())
        return f"{_plural(len(self.nodes), 'node')}: {shapes}" if self.nodes else "no alive nodes"


@dataclass(frozen=True)
class LayoutPlan:
    """How many engine replicas a job runs, what each reserves, and how many batches fly at once."""

    min_replicas: int
    max_replicas: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    #: Bundles one replica reserves; one per vLLM worker, or the one explicit ``replica_resources``.
    replica_bundles: tuple[Mapping[str, float], ...]
    explicit_replica_resources: bool
    accelerator_type: str | None
    batch_size: int
    max_concurrent_batches: int
    max_concurrent_batches_is_default: bool

    @property
    def replica_resources(self) -> dict[str, float]:
        """Everything one replica reserves, summed over its bundles."""
        return _sum_bundles(self.replica_bundles)

    @property
    def workers(self) -> int:
        """vLLM workers per replica: tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_per_replica(self) -> float:
        return self.replica_resources.get("GPU", 0.0)

    @property
    def max_batches_in_flight(self) -> int:
        return self.max_replicas * self.max_concurrent_batches

    def describe(self) -> str:
        """One line, e.g. ``2 replicas x 4 GPUs each (TP 2 x PP 2), 8 GPUs in all; accelerator H100; ...``."""
        replicas = _range(self.min_replicas, self.max_replicas)
        noun = "replica" if self.max_replicas == 1 else "replicas"
        parallel = f"TP {self.tensor_parallel_size} x PP {self.pipeline_parallel_size}"
        if self.explicit_replica_resources:
            each = _resources(self.replica_resources)
            source = "replica_resources" + ("" if self.workers == 1 else f", {parallel}")
            in_all = _resources(self.replica_resources, self.min_replicas, self.max_replicas)
        else:
            each, source = _plural(self.gpus_per_replica, "GPU"), parallel
            in_all = _resources({"GPU": self.gpus_per_replica}, self.min_replicas, self.max_replicas)
        default = " (Ray Data LLM's default)" if self.max_concurrent_batches_is_default else ""
        return (
            f"{replicas} {noun} x {each} each ({source}), {in_all} in all; "
            f"accelerator {self.accelerator_type or 'any'}; "
            f"batch_size {self.batch_size}, max_concurrent_batches {self.max_concurrent_batches}{default} "
            f"→ up to {_plural(self.max_batches_in_flight, 'batch')} in flight "
            f"({self.max_batches_in_flight * self.batch_size} rows)"
        )

    def check_fits(self, cluster: ClusterResources) -> None:
        """Raise :class:`ClusterLayoutError` when the cluster's alive nodes cannot host ``min_replicas``.

        Checks, in order: the accelerator type exists; the cluster has GPUs if a replica needs any;
        one placement unit (a whole replica, or one pipeline stage when PP > 1) fits some node; enough
        units fit for ``min_replicas`` replicas.
        A plain int ``concurrency=n`` asks for n replicas here: Ray Data grows its pool from one, so a
        smaller cluster would run but never reach n; pass ``(1, n)`` to accept a smaller pool. Only
        alive nodes count: a worker group scaled to zero shows up once a job asks for it, so for such
        clusters check against the group's shape (e.g. from the KubeRay manifest) instead.
        """
        self._check_accelerator(cluster)
        nodes = cluster.eligible(self.accelerator_type)
        if not nodes:
            raise self._replicas_error(0, cluster)
        unit, units_per_replica = self._placement_unit()
        if unit.get("GPU", 0.0) > 0 and cluster.total("GPU", self.accelerator_type) == 0:
            raise ClusterLayoutError(
                f"the job needs {_plural(self.gpus_per_replica, 'GPU')} per replica (tensor_parallel_size x "
                f"pipeline_parallel_size, or replica_resources), but the cluster has no GPU "
                f"({cluster.describe()}). On a CPU-only cluster with vLLM's CPU build, set "
                "replica_resources={'CPU': 1}.",
                parameter="replica_resources",
            )
        largest = max(nodes, key=lambda node: node.capacity_for(unit))
        if largest.units_of(unit) == 0:
            raise self._unit_error(unit, largest, cluster)
        fitting = sum(node.units_of(unit) for node in nodes) // units_per_replica
        if fitting < self.min_replicas:
            raise self._replicas_error(fitting, cluster)

    def _check_accelerator(self, cluster: ClusterResources) -> None:
        if self.accelerator_type is not None and self.accelerator_type not in cluster.accelerator_types:
            present = ", ".join(cluster.accelerator_types) or "none"
            raise ClusterLayoutError(
                f"accelerator_type={self.accelerator_type!r} is on no node of the cluster "
                f"(accelerator types present: {present}; {cluster.describe()}). "
                "Use one of those types, leave accelerator_type unset, or add such nodes.",
                parameter="accelerator_type",
            )

    def _placement_unit(self) -> tuple[dict[str, float], int]:
        """What must sit on one node, and how many of those make a replica."""
        if self.explicit_replica_resources or self.pipeline_parallel_size == 1:
            return self.replica_resources, 1
        per_stage = self.replica_bundles[: self.tensor_parallel_size]
        return _sum_bundles(per_stage), self.pipeline_parallel_size

    def _unit_error(
        self, unit: Mapping[str, float], largest: NodeResources, cluster: ClusterResources
    ) -> ClusterLayoutError:
        where = f"{self.accelerator_type} node" if self.accelerator_type else "node"
        if self.explicit_replica_resources:
            return ClusterLayoutError(
                f"replica_resources={dict(self.replica_bundles[0])!r} is one bundle and must fit on one "
                f"node, but the largest {where} has {largest.describe()} ({cluster.describe()}). "
                "Lower replica_resources to what one node has.",
                parameter="replica_resources",
            )
        gpus = _plural(unit.get("GPU", 0.0), "GPU")
        if self.pipeline_parallel_size == 1:
            return ClusterLayoutError(
                f"engine_kwargs tensor_parallel_size={self.tensor_parallel_size} needs {gpus} on one node "
                f"(tensor parallelism cannot span nodes), but the largest {where} has {largest.describe()} "
                f"({cluster.describe()}). Lower tensor_parallel_size to what one node has and set "
                "pipeline_parallel_size to spread the model over nodes.",
                parameter="engine_kwargs.tensor_parallel_size",
            )
        return ClusterLayoutError(
            f"engine_kwargs tensor_parallel_size={self.tensor_parallel_size} needs {gpus} on one node for "
            f"each of the {self.pipeline_parallel_size} pipeline stages, but the largest {where} has "
            f"{largest.describe()} ({cluster.describe()}). Lower tensor_parallel_size to what one node "
            "has and raise pipeline_parallel_size.",
            parameter="engine_kwargs.tensor_parallel_size",
        )

    def _replicas_error(self, fitting: int, cluster: ClusterResources) -> ClusterLayoutError:
        per_replica = {n: a for n, a in self.replica_resources.items() if n not in _CHECKED_RESOURCES_SKIP}
        concurrency = (
            f"{self.min_replicas}"
            if self.min_replicas == self.max_replicas
            else f"({self.min_replicas}, {self.max_replicas})"
        )
        on = f" on {self.accelerator_type} nodes" if self.accelerator_type else ""
        replicas = _plural(self.min_replicas, "replica")
        needs = f"concurrency={concurrency} needs {replicas} x ({_resources(per_replica)})"
        short = [
            f"{_resources({name: amount}, self.min_replicas)} but the cluster has "
            f"{_resources({name: cluster.total(name, self.accelerator_type)})}{on}"
            for name, amount in per_replica.items()
            if amount * self.min_replicas > cluster.total(name, self.accelerator_type) + 1e-9
        ]
        if short:
            why = f"{needs} = {'; '.join(short)}"
        else:
            held = _plural(fitting, "replica")
            why = f"{needs}; the cluster has enough in all, but split over its nodes{on} they hold {held}"
        return ClusterLayoutError(
            f"{why} ({cluster.describe()}). Lower concurrency (or its minimum), lower the per-replica "
            "size, or add nodes.",
            parameter="concurrency",
        )


def plan_layout(spec: BatchInferenceSpec) -> LayoutPlan:
    """The layout Ray Data LLM will use for ``spec`` (see the module docstring for the rules)."""
    tp = int(spec.engine_kwargs.get("tensor_parallel_size", 1))
    pp = int(spec.engine_kwargs.get("pipeline_parallel_size", 1))
    if isinstance(spec.concurrency, tuple):
        min_replicas, max_replicas = spec.concurrency
    else:  # unset: the job's replicas share one GPU (pipeline/generate/default_layout.py), one's fit
        min_replicas = max_replicas = spec.concurrency or 1
    if spec.replica_resources is not None:
        bundles: tuple[Mapping[str, float], ...] = (dict(spec.replica_resources),)
    else:
        bundles = tuple(dict(DEFAULT_WORKER_BUNDLE) for _ in range(tp * pp))
    return LayoutPlan(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        replica_bundles=bundles,
        explicit_replica_resources=spec.replica_resources is not None,
        accelerator_type=spec.accelerator_type,
        batch_size=spec.batch_size,
        max_concurrent_batches=spec.max_concurrent_batches or DEFAULT_MAX_CONCURRENT_BATCHES,
        max_concurrent_batches_is_default=spec.max_concurrent_batches is None,
    )


def cluster_resources_from_api(payload: Mapping[str, JsonValue]) -> ClusterResources:
    """The alive nodes in the JSON body of ``GET`` :data:`CLUSTER_NODES_ENDPOINT`.

    The body is ``{"result": true, "msg": "", "data": {"result": {"total": n, "result": [node, ...]}}}``;
    each node has ``node_id``, ``is_head_node``, ``state`` (``ALIVE`` or ``DEAD``), ``resources_total``
    and ``labels``. A node's accelerator type is its ``accelerator_type:<type>`` resource (what the
    scheduler matches), else its ``ray.io/accelerator-type`` label.
    """
    try:
        succeeded = payload.get("result") is not False
        rows = payload["data"]["result"]["result"] if succeeded else []
        nodes = tuple(_node_from_row(row) for row in rows if row.get("state") == "ALIVE")
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        shown = repr(payload)
        raise RayHookError(
            f"{_path()} answered in an unexpected shape ({type(err).__name__}: {err}): "
            f"{shown[:300] + '...' if len(shown) > 300 else shown}"
        ) from err
    if not succeeded:
        raise RayHookError(f"{_path()} answered with an error: {str(payload.get('msg'))[:300]}")
    return ClusterResources(nodes=nodes)


def _node_from_row(row: Mapping[str, JsonValue]) -> NodeResources:
    resources = {str(name): float(amount) for name, amount in (row.get("resources_total") or {}).items()}
    from_resource = [
        name.removeprefix(ACCELERATOR_RESOURCE_PREFIX)
        for name in resources
        if name.startswith(ACCELERATOR_RESOURCE_PREFIX)
    ]
    accelerator = from_resource[0] if from_resource else (row.get("labels") or {}).get(ACCELERATOR_LABEL)
    return NodeResources(
        node_id=str(row["node_id"]),
        resources=resources,
        accelerator_type=accelerator or None,
        is_head=bool(row.get("is_head_node", False)),
    )


def _sum_bundles(bundles: tuple[Mapping[str, float], ...]) -> dict[str, float]:
    summed: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            summed[name] = summed.get(name, 0.0) + amount
    return summed


def _path() -> str:
    return f"GET {CLUSTER_NODES_ENDPOINT.split('?', 1)[0]}"


def _amount(value: float) -> str:
    return f"{value:g}"


def _plural(count: float, noun: str) -> str:
    suffix = "" if count == 1 else ("es" if noun.endswith("ch") else "s")
    return f"{_amount(count)} {noun}{suffix}"


def _range(low: int | str, high: int | str) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


def _resources(resources: Mapping[str, float], low: int = 1, high: int | None = None) -> str:
    """``1 CPU``, ``2 CPUs + 1 GPU``; with ``low``/``high`` the amounts are multiplied (a range)."""
    high = low if high is None else high
    parts = []
    for name, amount in resources.items():
        text = _range(_amount(amount * low), _amount(amount * high))
        parts.append(f"{text} {name}{'s' if name in ('CPU', 'GPU') and amount * high != 1 else ''}")
    return " + ".join(parts)
