"""Warm engines across jobs: a pool of detached engine replicas per model and engine settings.

Why this design (issue 20; the alternatives were a Ray Serve LLM deployment fed through Ray Data
LLM's ``ServeDeploymentProcessorConfig``, and named detached actors):

* **The rows must not change path.** Our replica stages each row where it finishes, returns every
  choice and every input's embedding, honours per-row sampling parameters and sends images as
  ``LLM.generate`` does (:mod:`.engine_actor`). A Serve LLM deployment answers OpenAI requests
  through its own server, which would be a second row path with its own gaps. A pool replica
  (:mod:`.pool_replica`) builds the very same engine UDF and answers with Ray Data LLM's own per-row
  code; the job keeps its Ray Data pipeline, with a light stage (:mod:`.pooled_stage`) in place of
  the engine stage that stages rows exactly as before. Resume, dedupe and commit are untouched.
* **Ray does the distributed parts.** Replicas are named detached actors (namespace
  :data:`NAMESPACE`, name ``raybatch-engine-<fingerprint>-<index>``): Ray's GCS is the registry,
  ``get_if_exists`` makes concurrent jobs find or create the same replica without a lock of ours, a
  dead replica's name is freed by Ray and taken by its replacement, and Ray's scheduler places them.
* **Shared only between identical settings.** The fingerprint (:func:`pool_fingerprint`) covers the
  engine's constructor keywords (model, engine_kwargs, task type, pending-request bound, LoRA path;
  the path of an ``s3://`` model the job fetched names its S3 endpoint, its URI and its objects'
  ETags (:mod:`.model_cache`), so deployments whose endpoints differ under one URI, or a model
  changed in its bucket, never share replicas; of a model in a folder or read from S3 by the engine,
  its files as listed now (:func:`..stage.binding.model_digest`: new weights copied over the old get
  new engines, not the old ones still in memory)),
  the replica's resources and accelerator type, the compile cache folder, and the runtime env the
  replica runs in (our code's package, which is content-addressed, so a new provider version gets
  new engines; the env vars; pip). The author's own modules and the job's spec package are left out
  of the replica's runtime env: a replica serves many jobs and holds nothing of any one of them.
  So are our job-side settings (:data:`JOB_SIDE_SETTINGS`): read by the job's driver and stage
  actors only, they would split one engine shape into several pools.
* **Leases, keep-warm, scale to zero.** A job's driver holds a lease on each replica while it runs
  (:class:`PoolLease`, renewed every :data:`.pool_replica.LEASE_RENEW_SECONDS`); a replica with no
  lease and nothing in flight for ``keep_warm_seconds`` ends itself and frees its GPUs. A job whose
  replicas cannot be placed ends idle replicas of *other* pools at once (:func:`make_room`), so an
  idle pool never holds a cluster's GPUs against a waiting job; one that holds a live lease is never
  touched.
* **Fair sharing.** A replica lets each job have at most two of its engine's running batches in the
  engine at once (:data:`.pool_replica.JOB_SHARE_IN_RUNNING_BATCHES`, counted in sequences: a row
  of ``n`` choices counts ``n``), whatever the job's
  ``batch_size x max_concurrent_batches``, and vLLM schedules first come first served: two jobs on
  one pool each get about half of it. Each job rotates its batches over the replicas.
* **Scoped by deployment.** Every job's runtime env carries its Airflow deployment's pool scope
  (``RAYBATCH_ENGINE_POOL_SCOPE``), which is in the fingerprint: deployments never share replicas
  unless configured to. A job's stage refuses an actor of its replica's name that answers with
  another fingerprint (made outside this code) before any row goes to it; the lease's report skips
  such answers. Not a guard against code run on the cluster (docs/security.md).
* **Crashed or wedged.** A replica that dies (a fatal engine error ends it, as in Ray Data LLM) is
  replaced by the next stage that calls it, at most ``RAYBATCH_ENGINE_MAX_RESTARTS`` times per stage
  actor; a replica whose engine fails vLLM's health check when a job attaches is killed and replaced,
  never reused. Killing one task's job cancels only that job's requests (its lease lapses).

Scope: one replica is one actor holding its engine (vLLM's ``uni`` executor: tensor x pipeline
parallel = 1, the shape of our GPU benchmarks); larger engines run per job as before. LoRA adapters
work per row as in Ray Data LLM (``dynamic_lora_loading_path`` is part of the fingerprint).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.generate import cluster_demand
from airflow_provider_raybatch.pipeline.generate.pool_replica import (
    CONTROL_CALLS,
    CONTROL_GROUP,
    LEASE_RENEW_SECONDS,
    EngineReplica,
)
from airflow_provider_raybatch.pipeline.stage.binding import model_digest
from airflow_provider_raybatch.shared import job_settings
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs

if TYPE_CHECKING:
    import ray
    from ray.actor import ActorHandle

log = logging.getLogger("airflow_provider_raybatch.pipeline")

NAMESPACE = "raybatch_engine_pool"
NAME_PREFIX = "raybatch-engine-"
#: The engine constructor keywords that are the job's, not the engine's: left out of the fingerprint.
_PER_JOB_KWARGS = ("batch_size", "max_concurrent_batches", "should_continue_on_error", "log_engine_metrics")
#: The map_batches keywords that reserve the replica's resources (they go to the pool's actors).
RESOURCE_KWARGS = ("num_cpus", "num_gpus", "resources", "accelerator_type", "memory")
#: ``RAYBATCH_*`` settings of a job's env vars that no engine reads (job_settings.MAXIMA): its driver's
#: and its engine stage's. Left out of the runtime env the pool asks for, and so of the fingerprint
#: (Ray still merges the creating job's env vars into the replica's: one may carry them).
JOB_SIDE_SETTINGS = frozenset(job_settings.MAXIMA)
#: A replica index has at most this many digits (no pool has 10,000 replicas).
_MAX_INDEX_DIGITS = 4
#: How long a job waits for its replicas to be placed before it ends idle replicas of other pools.
MAKE_ROOM_AFTER_SECONDS = 5.0
#: How long the lease waits for a replica to say it is up (an actor answers at once once created).
UP_ANSWER_SECONDS = 0.5
#: How long make_room waits for an idle replica of another pool to say whether it ends.
RETIRE_ANSWER_SECONDS = 3.0
#: How long a job's end waits for its built replicas to take back its lease (they answer at once).
RELEASE_ANSWER_SECONDS = 10.0
#: How long an attaching job waits for a warm replica's health check before it replaces the replica.
HEALTH_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class EnginePool:
    """Where a job's engine replicas live and how to make one: picklable, shipped to the job's stage."""

    fingerprint: str
    replicas: int
    engine_kwargs: Kwargs
    actor_options: Kwargs
    compile_cache_dir: str | None
    keep_warm_seconds: float
    #: The job's chat-template stage's keywords, where the replicas render its prompts; the job's, so
    #: outside the fingerprint (pool_replica.EngineReplica.attach).
    chat_template: Kwargs | None = None
    #: The ``model_cache_dir`` of a model copy the driver fetched, which each replica checks on its own
    #: node before its engine loads it (a replica may be built on a node the fetch never reached).
    model_copy_root: str | None = None
    names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.names:  # replicas 0..n-1 unless chosen (preferring_live)
            names = tuple(f"{NAME_PREFIX}{self.fingerprint}-{index}" for index in range(self.replicas))
            object.__setattr__(self, "names", names)

    def preferring_live(self, alive: Iterable[str]) -> EnginePool:
        """This pool with its replicas chosen among ``alive`` names first (lowest index first), then the
        lowest free indices: a job that asks for fewer replicas than are up uses warm ones, never
        builds replica 0 while replica 1 idles. Jobs that see the same replicas choose the same."""
        prefix = f"{NAME_PREFIX}{self.fingerprint}-"
        live = sorted(
            int(suffix)
            for name in alive
            if name.startswith(prefix) and _is_replica_index(suffix := name[len(prefix) :])
        )
        chosen = live[: self.replicas]
        free = (index for index in itertools.count() if index not in live)
        chosen += [next(free) for _ in range(self.replicas - len(chosen))]
        return replace(self, names=tuple(f"{prefix}{index}" for index in sorted(chosen)))

    def replica(self, index: int) -> ActorHandle:
        """Replica ``index``: the live one, or a new one (its engine starts building now)."""
        import ray

        return (
            # Control calls never wait behind rows (a class setting: .options takes no concurrency_groups).
            ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_CALLS})(EngineReplica)
            .options(
                name=self.names[index],
                namespace=NAMESPACE,
                lifetime="detached",  # outlives the job that made it: that is the point
                get_if_exists=True,
                max_restarts=0,  # a dead replica is replaced (a fresh name holder), never restarted in place
                max_concurrency=10_000,  # rows of every job in flight at once; vLLM bounds its own batch
                **self.actor_options,
            )
            .remote(
                self.engine_kwargs,
                self.compile_cache_dir,
                self.fingerprint,
                self.keep_warm_seconds,
                self.chat_template,
                self.model_copy_root,
            )
        )

    def existing(self) -> set[str]:
        """The names of this pool's replicas that are alive now."""
        return live_replica_names() & set(self.names)


def _is_replica_index(text: str) -> bool:
    """Whether a name's suffix is one this code gives a replica: ASCII digits, a bounded number. Any
    actor in the namespace may hold a name: ``'²'`` passes ``str.isdigit`` and fails ``int``, and a
    huge index would be preferred over building replica 0."""
    return text.isascii() and text.isdigit() and len(text) <= _MAX_INDEX_DIGITS


def ray_is_up() -> bool:
    """Whether this process is connected to a Ray cluster (a job's driver; not a build without one)."""
    import ray

    return bool(ray.is_initialized())


def live_replica_names() -> set[str]:
    """The names of every pool's replicas alive now (Ray's named actors in :data:`NAMESPACE`)."""
    import ray.util

    return {
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == NAMESPACE
    }


def pool_fingerprint(
    engine_kwargs: dict[str, Any],
    actor_options: dict[str, Any],
    compile_cache_dir: str | None,
    model_files: str = "",
) -> str:
    """A stable hash of everything that makes two engines interchangeable (see the module doc).

    :param model_files: the model's files as listed now (:func:`..stage.binding.model_digest`).
    """
    engine = {key: value for key, value in engine_kwargs.items() if key not in _PER_JOB_KWARGS}
    shape = {
        "engine": engine,
        "actor": actor_options,
        "compile_cache_dir": compile_cache_dir,
        "model_files": model_files,
    }
    canonical = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_pool(
    engine_kwargs: dict[str, Any],
    map_batches_kwargs: dict[str, Any],
    replicas: int,
    keep_warm_seconds: float,
    compile_cache_dir: str | None,
    job_runtime_env: dict[str, Any],
    chat_template: dict[str, Any] | None = None,
    model_copy_root: str | None = None,
) -> EnginePool:
    """The pool for a job's vLLM stage, from what Ray Data LLM built for it.

    :param engine_kwargs: the stage's UDF constructor keywords.
    :param map_batches_kwargs: the stage's ``map_batches`` keywords (its replicas' resources).
    :param job_runtime_env: the job's runtime env: the replica keeps our code's package (the first
        ``py_modules`` entry, see ``jobs.job_shipping.upload_runtime_env``) and the rest but the
        other packages.
    :param chat_template: the job's chat-template stage's keywords (None: it has none), for the
        replicas to render its prompts with; not part of the fingerprint.
    :param model_copy_root: see :attr:`EnginePool.model_copy_root` (the model's path, in the
        fingerprint, names the copy).
    :raises ValueError: for an engine a pool cannot hold (tensor or pipeline parallel).
    """
    if "ray_remote_args_fn" in map_batches_kwargs:
        raise ValueError(
            "keep_warm_seconds: a warm pool holds one-actor engines (tensor_parallel_size x "
            "pipeline_parallel_size = 1); run this engine without keep_warm_seconds"
        )
    options: dict[str, Any] = {k: map_batches_kwargs[k] for k in RESOURCE_KWARGS if map_batches_kwargs.get(k)}
    runtime_env = {key: value for key, value in job_runtime_env.items() if key != "py_modules"}
    if job_runtime_env.get("py_modules"):
        runtime_env["py_modules"] = list(job_runtime_env["py_modules"])[:1]
    if isinstance(runtime_env.get("env_vars"), dict):
        env_vars = {
            key: value for key, value in runtime_env["env_vars"].items() if key not in JOB_SIDE_SETTINGS
        }
        runtime_env.pop("env_vars")
        if env_vars:
            runtime_env["env_vars"] = env_vars
    options["runtime_env"] = runtime_env
    model_files = model_digest(str(engine_kwargs.get("model", "")))
    fingerprint = pool_fingerprint(engine_kwargs, options, compile_cache_dir, model_files)
    return EnginePool(
        fingerprint,
        replicas,
        dict(engine_kwargs),
        options,
        compile_cache_dir,
        keep_warm_seconds,
        chat_template,
        model_copy_root,
    )


def make_room(needs: dict[str, float], keep_fingerprint: str | None, within_seconds: float) -> list[str]:
    """End idle replicas of other pools until a node that could host a replica needing ``needs`` has
    them free (:func:`.cluster_demand.lacking_by_node`); the names ended.

    A replica that holds a lease or has rows in flight says no; one still building its engine does not
    answer in time and is left alone. It gives up after about ``within_seconds`` (the lease's thread
    calls it between renewals, which must not lapse).
    """
    import ray
    import ray.util

    deadline = time.monotonic() + within_seconds
    ended: list[str] = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry.get("name", "")
        if entry.get("namespace") != NAMESPACE or not name.startswith(NAME_PREFIX):
            continue
        if keep_fingerprint is not None and name.startswith(f"{NAME_PREFIX}{keep_fingerprint}-"):
            continue
        if time.monotonic() >= deadline:
            break
        lacking = cluster_demand.lacking_by_node(needs, cluster_demand.node_resources_now())
        if not lacking or any(not short for short in lacking.values()):
            break  # no node could ever host it (ending replicas frees nothing), or one has room now
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            continue  # gone already
        answer_within = max(0.5, min(RETIRE_ANSWER_SECONDS, deadline - time.monotonic()))
        if _asked_to_retire(handle, lacking, answer_within):
            ended.append(name)
            # Its resources show as free only once it is gone: then see whether the job fits.
            _wait_until_gone(name, timeout=max(0.0, deadline - time.monotonic()))
    if ended:
        log.warning("Ended idle engine pool replicas %s to make room for this job.", ", ".join(ended))
    return ended


def _asked_to_retire(
    handle: ActorHandle,
    lacking: dict[str, list[str]],
    within: float,
) -> bool:
    """Whether the idle replica ended when asked. Only one holding some of each resource its node lacks
    for the job ends: one holding CPUs does not go for a job that waits for a GPU, nor one on an H100
    node for a job that needs an A100 (:meth:`.pool_replica.EngineReplica.retire_if_idle`)."""
    import ray

    try:
        ref = handle.retire_if_idle.remote(lacking)
    except TypeError:  # Ray checks the call against the creator's signature: a replica of an earlier
        # provider version takes no argument, and ends if idle, holding what the job lacks or not
        ref = handle.retire_if_idle.remote()
    try:
        return bool(ray.get(ref, timeout=within))
    except Exception:  # noqa: BLE001 - busy building, or unreachable: not ours to end
        with contextlib.suppress(Exception):  # a call left queued would end it once built
            ray.cancel(ref)
    return False


def replica_needs(actor_options: dict[str, Any]) -> dict[str, float]:
    """The resources one replica reserves, as ``ray.available_resources()`` names them."""
    needs = dict(actor_options.get("resources") or {})
    if actor_options.get("num_cpus"):
        needs["CPU"] = float(actor_options["num_cpus"])
    if actor_options.get("num_gpus"):
        needs["GPU"] = float(actor_options["num_gpus"])
    if actor_options.get("accelerator_type"):
        needs[f"accelerator_type:{actor_options['accelerator_type']}"] = 0.001
    return needs


class PoolLease:
    """A job's hold on its pool, from its driver: attach every replica, renew, release at the end.

    Started while the input is read (a cold replica builds its engine meanwhile), stopped after the
    engine stage. What it saw goes in the manifest (:meth:`describe`).
    """

    def __init__(self, pool: EnginePool) -> None:
        import ray

        self.pool = pool
        self.job_id = ray.get_runtime_context().get_job_id()
        self._warm = sorted(pool.existing())
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._started_at = time.time()  # wall clock, to place the replicas' own start and ready times
        self._ready_after: float | None = None
        self._replica_states: list[JsonObject | None] = []  # each replica's first attach answer
        self._replaced: list[str] = []
        self._ended_for_room: list[str] = []
        self._attaching: list[ray.ObjectRef] = []
        self._rows_by_replica: dict[str, int | None] = {}  # the job's rows each replica answered
        self._thread = threading.Thread(target=self._keep, name="raybatch-pool-lease", daemon=True)

    @property
    def started_at(self) -> float:
        """When the job asked for its replicas (epoch seconds): what it holds from, warm or cold."""
        return self._started_at

    def start(self) -> PoolLease:
        self._replace_unhealthy()
        # Creates the cold replicas (their engines build while the job reads its input).
        self._attaching = [
            self.pool.replica(index).attach.remote(self.job_id, self.pool.keep_warm_seconds)
            for index in range(self.pool.replicas)
        ]
        log.info(
            "Engine pool %s: %d of %d replicas warm; keep_warm_seconds=%g.",
            self.pool.fingerprint,
            len(self._warm),
            self.pool.replicas,
            self.pool.keep_warm_seconds,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        import ray

        self._stop.set()
        self._thread.join(timeout=10)
        self._note_when_ready()  # the engine stage may end within a second of the replicas' readiness
        done, _ = ray.wait(self._attaching, num_returns=len(self._attaching), timeout=0)
        if self._ready_after is None:  # the job ended on its built replicas while another still built
            self._replica_states = [_answer(ref) if ref in done else _BUILDING for ref in self._attaching]
        built = {name for name, ref in zip(self.pool.names, self._attaching, strict=True) if ref in done}
        releases = {}
        for name in self.pool.names:
            with contextlib.suppress(ValueError):  # gone already: nothing to release
                releases[name] = ray.get_actor(name, namespace=NAMESPACE).release.remote(self.job_id)
        # Only the built replicas' answers are waited for (bounded): one still building answers once
        # built, and the job must not wait for that (~10 s at the end of each job on
        # a half-warm pool). Should this driver end first, its lease there lapses (LEASE_SECONDS).
        waited = {name: ref for name, ref in releases.items() if name in built}
        ray.wait(list(waited.values()), num_returns=len(waited), timeout=RELEASE_ANSWER_SECONDS)
        for name, ref in waited.items():
            answer = _answer(ref, timeout=0)
            self._rows_by_replica[name] = answer.get("rows") if answer else None

    def describe(self) -> JsonObject:
        timings = self._replica_timings()
        built = [
            entry["engine_ready_s"] for entry in timings if entry["answered"] and entry["engine_ready_s"] >= 0
        ]
        return {
            "fingerprint": self.pool.fingerprint,
            "replicas": self.pool.replicas,
            "warm_replicas": len(self._warm),
            "keep_warm_seconds": self.pool.keep_warm_seconds,
            "replicas_ready_s": self._ready_after,
            # the replicas built for this job: how far apart their engines became ready (issue 23)
            "replica_ready_skew_s": round(max(built) - min(built), 3) if len(built) > 1 else None,
            "replica_timings": timings,
            "replaced_unhealthy": self._replaced,
            "ended_for_room": self._ended_for_room,
        }

    def _replace_unhealthy(self) -> None:
        """A warm replica whose engine fails vLLM's health check, or that is up but does not answer it,
        is killed, not reused. One still building its engine (another job started it a moment ago)
        cannot answer yet and is left to finish. One Ray calls unavailable (unreachable for a moment,
        as on a loaded node) is left too: it may be serving other jobs, and if it is dead after all,
        the engine stage replaces it when a row finds it so (:mod:`.pooled_stage`)."""
        import ray

        answered = []
        for name in self._warm:
            try:
                replica = ray.get_actor(name, namespace=NAMESPACE)
                if not _is_up(replica):
                    continue  # still building its engine: nothing to check yet
                ray.get(replica.health.remote(), timeout=HEALTH_TIMEOUT_SECONDS)
                answered.append(name)
            except ray.exceptions.GetTimeoutError:
                self._kill(name, "is up but did not answer its health check")
            except ray.exceptions.ActorUnavailableError:
                log.warning(
                    "Engine pool replica %s did not answer its health check (Ray: unavailable for "
                    "now): left running, not counted warm.",
                    name,
                )
            except Exception as err:  # noqa: BLE001 - dead or gone: replace it
                self._kill(name, f"failed its health check ({type(err).__name__})")
        self._warm = answered  # warm: an engine that answered; one still building is shared, not warm

    def _kill(self, name: str, why: str) -> None:
        import ray

        log.warning("Engine pool replica %s %s: replacing it.", name, why)
        with contextlib.suppress(ValueError):  # gone already
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        self._replaced.append(name)
        _wait_until_gone(name)

    def _keep(self) -> None:
        """Renew the leases every few seconds; while replicas are not placed, make room for them.

        Never raises: a failed round is logged and the next one tries again (a dead thread would let
        the job's leases lapse, and the replicas would cancel its rows).
        """
        renewed = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                renewing = time.monotonic() - renewed >= LEASE_RENEW_SECONDS
                if renewing:
                    renewed = time.monotonic()
                    self._renew()
                self._note_when_ready()
                # Every round until the replicas answered, then with each renewal: a replica that
                # died mid-job is replaced by the stage, and its replacement may wait for room too.
                waited = time.monotonic() - self._started
                look = self._ready_after is None or renewing
                if look and waited > MAKE_ROOM_AFTER_SECONDS and self._unplaced():
                    self._ended_for_room += make_room(
                        replica_needs(self.pool.actor_options), self.pool.fingerprint, LEASE_RENEW_SECONDS
                    )
            except Exception:  # noqa: BLE001 - see the docstring
                log.warning("Engine pool %s: a lease round failed.", self.pool.fingerprint, exc_info=True)

    def _note_when_ready(self) -> None:
        import ray

        if self._ready_after is None:
            _, pending = ray.wait(self._attaching, num_returns=len(self._attaching), timeout=0)
            if not pending:
                self._ready_after = round(time.monotonic() - self._started, 3)
                self._replica_states = [_answer(ref) for ref in self._attaching]

    def _unplaced(self) -> bool:
        """Whether one of this job's replicas is not up yet while Ray's scheduler cannot place an actor
        of its shape: then it waits for resources (one that is building its engine, or whose worker is
        starting, does not need room: ending other pools' idle replicas then would be for nothing)."""
        import ray

        for name in self.pool.names:
            try:
                replica = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                continue  # dead: the stage that calls it next replaces it
            if not _is_up(replica):
                return cluster_demand.actor_waits_for(replica_needs(self.pool.actor_options))
        return False

    def _replica_timings(self) -> list[JsonObject]:
        """Each replica's engine start and ready time (seconds after this lease started; a warm one's
        are negative: an earlier job built it), its build time, and how many of the job's rows it
        answered (None where it could not say: it died, or did not answer in time)."""
        timings = []
        for name, state in zip(self.pool.names, self._replica_states, strict=False):
            index = int(name.rpartition("-")[2])  # the replica's own index in its pool
            if state is not _BUILDING and (
                state is None or state.get("fingerprint") != self.pool.fingerprint
            ):
                state = None  # dead, or an actor of the name serving another engine: no report of it
            if state is None or state is _BUILDING:
                building = state is _BUILDING  # then it took none of the job's rows (pooled_stage)
                rows = 0 if building else self._rows_by_replica.get(name)
                timings.append(
                    {"replica": index, "answered": False, "building_at_job_end": building, "rows": rows}
                )
                continue
            timings.append(
                {
                    "replica": index,
                    "answered": True,
                    "rows": self._rows_by_replica.get(name),
                    "engine_start_s": round(state["engine_started_at"] - self._started_at, 3),
                    "engine_ready_s": round(state["engine_ready_at"] - self._started_at, 3),
                    "engine_build_seconds": state["engine_build_seconds"],
                }
            )
        return timings

    def _renew(self) -> None:
        import ray

        for name in self.pool.names:
            try:
                replica = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                continue  # dead: the stage that calls it next replaces it
            replica.attach.remote(self.job_id, self.pool.keep_warm_seconds)


class RoomKeeper:
    """For a job on engines of its own: while Ray cannot place an actor of its replicas' shape, end idle
    replicas of warm pools (:func:`make_room`). A pool's own jobs do this in their lease
    (:meth:`PoolLease._keep`); without this, a pool kept warm for a day would hold its GPUs against
    every job that does not use it, and Ray Data would wait for them forever.
    """

    def __init__(self, needs: dict[str, float]) -> None:
        self.needs = needs
        self.ended: list[str] = []
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="raybatch-make-room", daemon=True)

    def start(self) -> RoomKeeper:
        # An engine reserving nothing waits for nothing a pool holds; a build outside a job has no pool.
        if self.needs and ray_is_up():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _keep(self) -> None:
        """A round every :data:`LEASE_RENEW_SECONDS` once :data:`MAKE_ROOM_AFTER_SECONDS` have passed;
        never raises (a failed round is logged, the next one tries again)."""
        while not self._stop.wait(LEASE_RENEW_SECONDS):
            try:
                self.round()
            except Exception:  # noqa: BLE001 - see the docstring
                log.warning("Making room for this job's engines failed this round.", exc_info=True)

    def round(self) -> None:
        """End idle pool replicas if an actor of this job's replica shape waits for resources now. Where
        Ray cannot say, nothing: this job's replicas may all be placed, and idle pools are not ended for
        nothing (a pool's lease, which knows whether its replicas are up, makes room then)."""
        waited = time.monotonic() - self._started
        if waited > MAKE_ROOM_AFTER_SECONDS and cluster_demand.actor_waits_for(
            self.needs, when_unknown=False
        ):
            self.ended += make_room(self.needs, None, LEASE_RENEW_SECONDS)


def _is_up(replica: ActorHandle, wait_seconds: float = UP_ANSWER_SECONDS) -> bool:
    """Whether the replica's constructor has returned (its engine is built), asked through Ray's own
    ``__ray_ready__``, which an actor answers once created; a dead one counts as up (its next call
    fails, and the caller replaces it). Not the state API: it needs the dashboard's address, which a
    process outside a job finds ambiguous where two clusters share a machine."""
    import ray

    ready, _ = ray.wait([replica.__ray_ready__.remote()], timeout=wait_seconds)
    return bool(ready)


#: A replica's state in the lease when the job ended before its engine was built (the job's rows went
#: to the replicas that were: pooled_stage routes batches only to built replicas).
_BUILDING: JsonObject = {}


def _answer(ref: ray.ObjectRef, timeout: float = 5.0) -> JsonObject | None:
    """A replica's answer to one of the lease's calls; None if it died (or had not answered) by then."""
    import ray

    try:
        answer: dict[str, Any] = ray.get(ref, timeout=timeout)
    except Exception:  # noqa: BLE001 - dead or gone: the engine stage replaces it
        return None
    return answer


def _wait_until_gone(name: str, timeout: float = 30.0) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)
