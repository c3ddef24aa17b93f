"""pipeline/generate/engine_pool.py, pool_replica.py and pooled_stage.py without a cluster: which engines
are interchangeable, what a replica keeps of a job, leases and keep-warm, and a dead replica replaced.

The end-to-end behaviour (a warm second job, two jobs on one engine, a replica killed mid-job) is
tests/integration/test_warm_pool.py; scale to zero, tests/integration/test_multinode.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate.cluster_demand import (
    lacking_by_node,
    short_of,
    would_make_room,
)
from airflow_provider_raybatch.pipeline.generate.engine_pool import (
    JOB_SIDE_SETTINGS,
    EnginePool,
    plan_pool,
    replica_needs,
)
from airflow_provider_raybatch.shared.job_settings import POOL_SCOPE_ENV
from tests.unit.pipeline.ray_env import part_report, run_parts_in_ray_env

ENGINE = {
    "model": "/models/tiny",
    "engine_kwargs": {"max_model_len": 512},
    "task_type": "generate",
    "batch_size": 16,
    "max_concurrent_batches": 8,
}
JOB_ENV = {
    "py_modules": ["gcs://_ray_pkg_ours.zip", "gcs://_ray_pkg_authors.zip", "gcs://_ray_pkg_job.zip"],
    "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}


def _plan(engine=ENGINE, resources=None, runtime_env=JOB_ENV, keep_warm=60.0) -> EnginePool:
    return plan_pool(dict(engine), resources or {"num_cpus": 1}, 2, keep_warm, None, runtime_env)


def test_jobs_with_the_same_engine_share_a_pool_whatever_their_batches_and_keep_warm() -> None:
    one = _plan()
    other = _plan(engine={**ENGINE, "batch_size": 64, "max_concurrent_batches": 2}, keep_warm=5)
    assert one.fingerprint == other.fingerprint
    assert one.names == (f"raybatch-engine-{one.fingerprint}-0", f"raybatch-engine-{one.fingerprint}-1")


@pytest.mark.parametrize(
    "change",
    [
        {"engine": {**ENGINE, "model": "/models/other"}},
        {"engine": {**ENGINE, "engine_kwargs": {"max_model_len": 1024}}},
        {"engine": {**ENGINE, "task_type": "embed"}},
        {"resources": {"num_gpus": 1}},
        {"resources": {"num_cpus": 1, "accelerator_type": "H100"}},
        {"runtime_env": {**JOB_ENV, "py_modules": ["gcs://_ray_pkg_newer_provider.zip"]}},
        {"runtime_env": {**JOB_ENV, "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2"}}},
        # Another Airflow deployment's job (jobs/job_shipping.py sets the scope in every job).
        {"runtime_env": {**JOB_ENV, "env_vars": {**JOB_ENV["env_vars"], POOL_SCOPE_ENV: "dev"}}},
    ],
)
def test_any_other_engine_setting_resource_or_code_version_is_another_pool(change: dict) -> None:
    assert _plan(**change).fingerprint != _plan().fingerprint


def test_a_replica_keeps_our_code_not_the_jobs_own_packages() -> None:
    """The spec's package and the author's modules are one job's: a replica serves many."""
    pool = _plan()
    assert pool.actor_options["runtime_env"] == {
        "py_modules": ["gcs://_ray_pkg_ours.zip"],
        "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    other_job = {
        "py_modules": ["gcs://_ray_pkg_ours.zip", "gcs://_ray_pkg_other_job.zip"],
        "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    assert _plan(runtime_env=other_job).fingerprint == pool.fingerprint


def test_the_jobs_own_settings_stay_out_of_the_replica_and_do_not_split_the_pool() -> None:
    """RAYBATCH_WARM_WORKERS and the like are read by the job's driver and stage actors, never by an
    engine: a DAG that sets one shares the engine of a DAG that does not."""
    from airflow_provider_raybatch.pipeline import worker_warmup
    from airflow_provider_raybatch.pipeline.generate import engine
    from airflow_provider_raybatch.pipeline.read import dedupe, prepared_cache

    settings = (
        worker_warmup.WARM_WORKERS_ENV,
        dedupe.DRIVER_SCAN_MAX_ROWS_ENV,
        prepared_cache.KEEP_MIN_ROWS_ENV,
        engine.ENGINE_MAX_RESTARTS_ENV,
    )
    assert frozenset(settings) == JOB_SIDE_SETTINGS
    tuned = {**JOB_ENV, "env_vars": {**JOB_ENV["env_vars"], **dict.fromkeys(settings, "0")}}
    assert _plan(runtime_env=tuned).actor_options == _plan().actor_options
    assert _plan(runtime_env=tuned).fingerprint == _plan().fingerprint
    only_ours = {"py_modules": JOB_ENV["py_modules"], "env_vars": {worker_warmup.WARM_WORKERS_ENV: "0"}}
    assert _plan(runtime_env=only_ours).actor_options["runtime_env"] == {
        "py_modules": ["gcs://_ray_pkg_ours.zip"]
    }


@pytest.mark.parametrize(
    ("replicas", "alive", "chosen"),
    [
        (1, [], [0]),
        (1, [1], [1]),  # replica 0 went (a crash, keep_warm_seconds=0): the warm replica 1, not a cold 0
        (2, [1], [0, 1]),
        (2, [3, 1, 5], [1, 3]),
        (3, [4], [0, 1, 4]),
        (1, ["x", "7a"], [0]),  # not replica names of this pool
        # Names another tenant's actor may hold: not digits to int() ('²' passes str.isdigit), and an
        # index no pool reaches, which would be taken before building replica 0.
        (1, ["\u00b2", "\u0663", "99999999999"], [0]),
    ],
)
def test_a_job_takes_the_pools_live_replicas_first(replicas: int, alive: list, chosen: list[int]) -> None:
    pool = (
        _plan() if replicas == 2 else plan_pool(dict(ENGINE), {"num_cpus": 1}, replicas, 60.0, None, JOB_ENV)
    )
    prefix = f"raybatch-engine-{pool.fingerprint}-"
    names = [f"{prefix}{index}" for index in alive]
    other_pool = ["raybatch-engine-0000000000000000-0"]

    taken = pool.preferring_live([*names, *other_pool])

    assert taken.names == tuple(f"{prefix}{index}" for index in chosen)
    assert (taken.fingerprint, taken.replicas) == (pool.fingerprint, pool.replicas)
    assert taken.preferring_live([*names, *other_pool]) == taken  # another job that sees the same, the same


def test_a_tensor_parallel_engine_is_not_pooled() -> None:
    with pytest.raises(ValueError, match="one-actor engines"):
        plan_pool(dict(ENGINE), {"ray_remote_args_fn": object()}, 1, 60.0, None, {})


def test_new_weights_in_the_models_folder_get_a_new_pool(tmp_path: Path) -> None:
    """A warm replica holds the weights it loaded: once the folder's files change (a fine-tune copied
    over the old one), a job must not be served by it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"old weights")
    engine = {**ENGINE, "model": str(model)}
    before = _plan(engine).fingerprint

    assert _plan(engine).fingerprint == before
    (model / "model.safetensors").write_bytes(b"new weights, longer")
    assert _plan(engine).fingerprint != before


def test_what_a_replica_needs_and_whether_it_fits() -> None:
    needs = replica_needs(
        {"num_gpus": 1, "num_cpus": 2, "resources": {"engine_slot": 1}, "accelerator_type": "H100"}
    )
    assert needs == {"GPU": 1.0, "CPU": 2.0, "engine_slot": 1, "accelerator_type:H100": 0.001}
    assert short_of(needs, {"GPU": 1.0, "CPU": 8.0, "engine_slot": 1.0, "accelerator_type:H100": 1.0}) == []
    assert short_of(needs, {"GPU": 0.0, "CPU": 8.0, "engine_slot": 1.0, "accelerator_type:H100": 1.0}) == [
        "GPU"
    ]


_REPLICA = """
import asyncio, json, time
from airflow_provider_raybatch.pipeline.generate import pool_replica
from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

pool_replica.LEASE_SECONDS = 0.5
pool_replica._TICK_SECONDS = 0.05

class Engine:  # Ray Data LLM's UDF: rows of job "stuck" never finish; the others at once
    async def _generate_with_error_handling(self, row, batch_uuid):
        if row["job"] == "stuck":
            await asyncio.Event().wait()
        return {"generated_text": "out " + row["source"], "embeddings": None}

replica = object.__new__(EngineReplica)
replica.__dict__.update(_engine=Engine(), _fingerprint="f", _engine_build_seconds=1.0, _keep_warm_seconds=0.0,
                        _engine_started_at=0.0, _engine_ready_at=1.0,
                        _leases={}, _in_flight={}, _rows_by_source={},
                        _jobs_served=[], _rows_done=0, _rows_by_job={},
                        _watch=None, _retiring=False, _chat_templates={}, _job_templates={},
                        _last_active=0.0, _job_share=4, _shares={})
retired = []
replica._retire = lambda why: (retired.append(why), setattr(replica, "_retiring", True))

async def main():
    loop = asyncio.get_running_loop()
    before = await replica.attach("live", keep_warm_seconds=0.3)
    await replica.attach("stuck", keep_warm_seconds=0.3)
    answer = await replica.generate({"source": "a:1", "job": "live"}, "live")
    stuck = loop.create_task(replica.generate({"source": "s:1", "job": "stuck"}, "stuck"))
    await asyncio.sleep(0.1)
    busy = replica._state()
    idle_refused = await replica.retire_if_idle()
    for _ in range(10):  # "live" renews its lease as a running job's driver does; "stuck" was killed
        await replica.attach("live", keep_warm_seconds=0.3)
        await asyncio.sleep(0.1)
    cancelled = stuck.cancelled()
    retired_while_leased = list(retired)
    released = await replica.release("live")
    await asyncio.sleep(0.6)
    after = replica._state()
    # A stopped job's driver releases its lease: what it still had in the engine is cancelled at once.
    replica.__dict__.update(_retiring=False, _keep_warm_seconds=60.0)
    await replica.attach("stopped", keep_warm_seconds=60.0)
    stopped = loop.create_task(replica.generate({"source": "s:2", "job": "stuck"}, "stopped"))
    await asyncio.sleep(0.1)
    released_stopped = await replica.release("stopped")
    await asyncio.sleep(0.05)
    # A retiring replica takes no new row: the call waits for the actor's end (its caller then replaces
    # the replica) instead of answering from an engine that is shutting down.
    replica._retiring = True
    try:
        late = await asyncio.wait_for(replica.generate({"source": "a:2", "job": "live"}, "live"), 0.3)
    except asyncio.TimeoutError:
        late = "waited"
    return {"before": before, "answer": answer, "busy": busy, "idle_refused": idle_refused,
            "cancelled": cancelled, "retired_while_leased": retired_while_leased, "retired": list(retired),
            "after": after, "stopped_cancelled": stopped.cancelled(), "late": late, "released": released,
            "released_stopped": released_stopped, "rows_by_job_left": replica._rows_by_job}

report = asyncio.run(main())

# A replica whose creator died while its engine built: no job ever attaches, and it ends by itself
# (its watch runs from its constructor, on the actor's loop); until the lease time has passed since it
# became ready, another job's make-room does not end it (its creator's attach may be on its way).
async def orphaned():
    orphan = object.__new__(EngineReplica)
    orphan.__dict__.update(_engine=Engine(), _fingerprint="f", _keep_warm_seconds=0.2, _watch=None,
                           _retiring=False, _last_active=time.monotonic(), _leases={}, _in_flight={},
                           _rows_by_source={}, _jobs_served=[])
    orphan._retire = lambda why: (retired.append(why), setattr(orphan, "_retiring", True))
    fresh_refused = await orphan.retire_if_idle()
    started = time.monotonic()
    await asyncio.wait_for(orphan._watch_leases(), 5)
    return {"orphan_retired": retired[-1], "orphan_after": round(time.monotonic() - started, 1),
            "fresh_refused": fresh_refused}

report.update(asyncio.run(orphaned()))

# make_room asks an idle replica to end only if it holds some of each resource its node lacks.
async def asked_for(lacking):
    spare = object.__new__(EngineReplica)
    spare.__dict__.update(_retiring=False, _jobs_served=["earlier"], _last_active=0.0, _leases={},
                          _in_flight={}, _rows_by_source={})
    spare._place = lambda: ("node-a", {"CPU": 1.0})
    spare._retire = lambda why: setattr(spare, "_retiring", True)
    return await spare.retire_if_idle(lacking)

report.update({"short_of_a_slot": asyncio.run(asked_for({"node-a": ["replica_slot"]})),
               "short_of_cpus_and_a_slot": asyncio.run(asked_for({"node-a": ["CPU", "replica_slot"]})),
               "short_of_cpus": asyncio.run(asked_for({"node-a": ["CPU"]})),
               "short_of_cpus_elsewhere": asyncio.run(asked_for({"node-b": ["CPU"]})),
               "short_of_anything": asyncio.run(asked_for(None))})
part_done(report)
"""


def test_a_replica_cancels_a_lapsed_jobs_rows_keeps_a_leased_one_and_retires_after_keep_warm(
    without_cluster: dict,
) -> None:
    report = part_report(without_cluster, "replica")
    assert report["before"]["jobs_served"] == 0 and report["answer"]["generated_text"] == "out a:1"
    assert (report["busy"]["leases"], report["busy"]["in_flight"], report["busy"]["rows_done"]) == (2, 1, 1)
    assert report["idle_refused"] is False  # a replica with leases is never ended for room
    # The killed job's lease lapsed: its row in the engine was cancelled (vLLM aborts it); the job
    # that kept renewing kept the replica.
    assert report["cancelled"] is True and report["retired_while_leased"] == []
    assert report["retired"][0] == "idle for 0.3 s (keep_warm_seconds)"
    assert report["stopped_cancelled"] is True  # released by a stopped job: its rows no longer generate
    # Its release tells a job how many of its rows the replica answered, and forgets the job.
    assert report["released"] == {"rows": 1} and report["released_stopped"] == {"rows": 0}
    assert report["rows_by_job_left"] == {}
    assert report["late"] == "waited"  # a retiring replica answers no row
    # No job ever attached (its creator died mid-build): it ended after the lease time (0.5 s here).
    assert report["orphan_retired"].startswith("no job attached within")
    assert 0.4 <= report["orphan_after"] <= 2.0
    assert report["fresh_refused"] is False  # just built, nobody attached yet: not ended for room
    # An idle replica holding CPUs only stays for a job that waits for a replica slot (CPUs or not):
    # its end would not let that job's replica be placed (held test jobs wait so beside the session's
    # warm pools).
    # One on another node than those that could host the waiting replica stays too.
    asked = (
        "short_of_a_slot",
        "short_of_cpus_and_a_slot",
        "short_of_cpus",
        "short_of_cpus_elsewhere",
        "short_of_anything",
    )
    assert [report[key] for key in asked] == [False, False, True, False, True]
    assert (report["after"]["leases"], report["after"]["in_flight"], report["after"]["jobs_served"]) == (
        0,
        0,
        2,
    )


_STAGE = """
import asyncio, json
import ray
from airflow_provider_raybatch.pipeline.generate import pooled_stage, rows_in_flight

class Call:
    def __init__(self, fn): self.fn = fn
    def remote(self, *args): return self.fn(*args)

pooled_stage.UNREACHABLE_RETRY_SECONDS = 0.01
pooled_stage.UNREACHABLE_GRACE_SECONDS = 0.5

builds = [0]
class BuildFailed(ray.exceptions.RayActorError):  # as Ray says a replica's constructor raised
    actor_init_failed = True
    def __init__(self):
        super().__init__()
        builds[0] += 1
        self.pid = 4000 + builds[0]  # each build its own process: the same error, other numbers
    def __str__(self):  # vLLM's parent error, then ours with the EngineCore's (engine_actor.py)
        return ("The actor died because of an error raised in its creation task, "
                f"ray::R.__init__() (pid={self.pid})\\n"
                '  File "core_client.py", line 9, in wait_for_engine_startup\\n'
                "RuntimeError: Engine core initialization failed. See root cause above.\\n\\n"
                "The above exception was the direct cause of the following exception:\\n\\n"
                '  File "engine_actor.py", line 90, in __init__\\n'
                "airflow_provider_raybatch.pipeline.generate.engine_actor.EngineBuildError: ValueError: No "
                f"available memory for the cache blocks (pid {self.pid}). Try increasing "
                "gpu_memory_utilization (vLLM's EngineCore, building the engine).")

def fault(kind):  # a death, or Ray's "unavailable": a replica unreachable for a moment (a loaded node)
    if kind == "lease lapsed":  # the replica cancelled the job's rows: its lease was not renewed in time
        return ray.exceptions.TaskCancelledError()
    if "unreachable" in str(kind):
        return ray.exceptions.ActorUnavailableError("connection reset", None)
    if kind == "build":
        return BuildFailed()
    return ray.exceptions.RayActorError()

made = []
class Replica:
    def __init__(self, index, deaths):
        self._actor_id = f"actor-{len(made)}"
        self.deaths = deaths
        self.attached = 0
        self.generated = 0
        self.generate = Call(self._generate)
        self.attach = Call(self._attach)
        self.__ray_ready__ = Call(self._ready)
    async def _ready(self):
        return True
    async def _attach(self, job_id, keep_warm, chat_template):
        if self.deaths and self.deaths[-1] in ("attach", "attach unreachable"):
            raise fault(self.deaths.pop())
        self.attached += 1
        if self.deaths and self.deaths[-1] == "foreign":  # an actor of the name, made outside our code
            return {"fingerprint": "0123456789abcdef"}
        return {"fingerprint": "f", "jobs_served": 0}  # the lease's answer (EngineReplica._state)
    async def _generate(self, row, job_id, render):
        self.generated += 1
        if self.deaths and self.deaths[-1] not in ("attach", "attach unreachable", "foreign"):
            raise fault(self.deaths.pop())
        text = f"{self._actor_id} {row['source']}"
        return {"__idx_in_batch": row["__idx_in_batch"], "generated_text": text}

class Pool:
    replicas, keep_warm_seconds, names, fingerprint = 1, 60.0, ("raybatch-engine-f-0",), "f"
    chat_template = None
    def __init__(self, deaths): self.deaths = deaths
    def replica(self, index):
        made.append(Replica(index, self.deaths))
        return made[-1]

def client_of(deaths):  # a stage actor's client of a one-replica pool whose replicas fail as deaths says
    made.clear()
    client = object.__new__(pooled_stage._PoolClient)
    client.__dict__.update(data_column="__data", expected_input_keys=set(), _pool=Pool(deaths), _job_id="job",
                           _handles={}, _attached={}, _built={}, _dead=set(), _next=0, _replaced=0,
                           _max_replaced=2, _last_build_failure=None, _render_in_pool=True)
    return client

async def run(deaths):
    client = client_of(deaths)
    rows = [{"source": f"a:{i}", "__idx_in_batch": i} for i in range(3)]
    try:
        out = [row async for row in client.udf(rows)]
        return {"rows": sorted(row["generated_text"] for row in out), "made": len(made),
                "attached": [replica.attached for replica in made]}
    except pooled_stage.PoolReplicaLost as err:
        return {"error": str(err), "made": len(made), "generated": sum(r.generated for r in made)}

async def unreachable_for(seconds, rows=1):  # every call fails as unavailable for that long; then answers
    deaths = ["unreachable"] * 10_000
    client = client_of(deaths)
    asyncio.get_running_loop().call_later(seconds, deaths.clear)
    batch = [{"source": f"a:{i}", "__idx_in_batch": i} for i in range(rows)]
    out = [row async for row in client.udf(batch)]
    texts = sorted(row["generated_text"] for row in out)
    return {"rows": texts, "made": len(made), "replaced": client._replaced}

async def most_in_flight(rows, cap):  # the most rows one stage actor has waiting on the replicas at once
    rows_in_flight.ROWS_IN_FLIGHT_PER_STAGE_ACTOR = cap
    inside, most = [0], [0]
    answer = Replica._generate
    async def slow(self, row, job_id, render):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        await asyncio.sleep(0.01)
        inside[0] -= 1
        return await answer(self, row, job_id, render)
    Replica._generate = slow
    try:
        out = [row async for row in client_of([]).udf([{"source": f"a:{i}", "__idx_in_batch": i}
                                                      for i in range(rows)])]
    finally:
        Replica._generate = answer
    return {"rows": len(out), "most": most[0]}

async def most_bytes_in_flight(rows, size, most):  # the most prompt bytes one stage actor has in a replica
    rows_in_flight.BYTES_IN_FLIGHT_PER_STAGE_ACTOR = most
    inside, top = [0], [0]
    answer = Replica._generate
    async def slow(self, row, job_id, render):
        inside[0] += len(row["prompt"])
        top[0] = max(top[0], inside[0])
        await asyncio.sleep(0.01)
        inside[0] -= len(row["prompt"])
        return await answer(self, row, job_id, render)
    Replica._generate = slow
    try:
        batch = [{"source": f"a:{i}", "__idx_in_batch": i, "prompt": "x" * size} for i in range(rows)]
        out = [row async for row in client_of([]).udf(batch)]
    finally:
        Replica._generate = answer
    return {"rows": len(out), "most": top[0]}

async def cancelled_in_replica():  # a batch one row of which fails: the others' calls in the replica
    cancelled, cancel, answer = [], pooled_stage._cancel_in_replica, Replica._generate
    async def first_fails(self, row, job_id, render):
        if row["__idx_in_batch"] == 0:
            raise ValueError("the replica refused the row")
        await asyncio.sleep(30)
    pooled_stage._cancel_in_replica, Replica._generate = cancelled.append, first_fails
    try:
        batch = [{"source": f"a:{i}", "__idx_in_batch": i} for i in range(3)]
        try:
            [row async for row in client_of([]).udf(batch)]
        except ValueError as err:
            failed = str(err)
        await asyncio.sleep(0.05)  # the batch's other rows' tasks take their cancellation
    finally:
        pooled_stage._cancel_in_replica, Replica._generate = cancel, answer
    return {"failed": failed, "cancelled": len(cancelled)}

def stage_failed(error, name="pooled_stage.PoolReplicaLost"):  # run_batch's error for the engine dataset
    from airflow_provider_raybatch.pipeline import run as run_module
    wrapped = Exception("ray::MapWorker(MapBatches(RaybatchPooledEngineStageUDF)).submit() (pid=1)\\n"
                        f"airflow_provider_raybatch.pipeline.generate.{name}: {error}\\n\\n"
                        "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    return str(run_module.EngineStageFailed(wrapped))

alike_report = asyncio.run(run(["build"] * 8))
too_many_report = asyncio.run(run([1] * 8))
part_done(({"one_death": asyncio.run(run([1])), "too_many": too_many_report,
                  "build_fails_alike": alike_report,
                  "stage_failed": stage_failed(alike_report["error"]),
                  "stage_died": stage_failed(too_many_report["error"]),
                  "stage_built_once": stage_failed("ValueError: CUDA out of memory. (vLLM's EngineCore, "
                                                   "building the engine).", "engine_actor.EngineBuildError"),
                  "dead_on_attach": asyncio.run(run(["attach"])),
                  "foreign": asyncio.run(run(["foreign"])),
                  "unreachable": asyncio.run(run(["unreachable"] * 8)),
                  "unreachable_on_attach": asyncio.run(run(["attach unreachable"] * 2)),
                  "unreachable_past_grace": asyncio.run(unreachable_for(0.8)),
                  "three_rows_past_grace": asyncio.run(unreachable_for(0.8, rows=3)),
                  "lease_lapsed": asyncio.run(run(["lease lapsed"] * 2)),
                  "lease_keeps_lapsing": asyncio.run(run(["lease lapsed"] * 20)),
                  "capped": asyncio.run(most_in_flight(rows=9, cap=2)),
                  "bytes_capped": asyncio.run(most_bytes_in_flight(rows=8, size=10_000, most=25_000)),
                  "given_up": asyncio.run(cancelled_in_replica())}))
"""


@pytest.fixture(scope="module")
def without_cluster() -> dict:
    """The snippets that need Ray's modules but no cluster, run in one interpreter: a Ray import each
    time costs seconds of CPU, half a minute on a loaded machine."""
    return run_parts_in_ray_env({"stage": _STAGE, "replica": _REPLICA, "render": _RENDER})


@pytest.fixture(scope="module")
def on_cluster() -> dict:
    """The snippets that need a cluster, on one local Ray cluster (a start costs ~5 s of CPU): each finds
    the pool's namespace empty (run_parts_in_ray_env ends what the one before left)."""
    parts = {
        "health": _HEALTH,
        "routing": _ROUTING,
        "control": _CONTROL_CALLS_BESIDE_ROWS,
        "lease": _LEASE,
        "give_way": _GIVE_WAY,
    }
    cluster = {
        "address": "local",
        "num_cpus": 2,
        "resources": {"slot": 3},
        "include_dashboard": False,
        "logging_level": "ERROR",
    }
    return run_parts_in_ray_env(parts, ray_init=cluster)


@pytest.fixture
def stage_report(without_cluster: dict) -> dict:
    return part_report(without_cluster, "stage")


_CONTROL_CALLS_BESIDE_ROWS = """
import asyncio, json, threading, time
import ray
from airflow_provider_raybatch.pipeline.generate import pool_replica
from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

class Engine:  # Ray Data LLM's UDF: no row ever finishes, so every row holds one of the rows' slots
    async def _generate_with_error_handling(self, row, batch_uuid):
        await asyncio.Event().wait()

    class llm:
        class engine:
            @staticmethod
            async def check_health():
                return None

class HeldReplica(EngineReplica):  # the replica's own methods, its engine a stand-in
    def __init__(self):
        self.__dict__.update(_engine=Engine(), _fingerprint="f", _engine_build_seconds=1.0,
                             _keep_warm_seconds=60.0, _engine_started_at=0.0, _engine_ready_at=1.0,
                             _leases={}, _in_flight={}, _rows_by_source={},
                             _jobs_served=[], _rows_done=0, _rows_by_job={},
                             _watch=None, _retiring=False, _chat_templates={}, _job_templates={},
                             _last_active=0.0, _job_share=100, _shares={})
        self._loop = asyncio.get_running_loop()
        self._rows_thread = threading.get_ident()

    def rows_thread(self):
        return self._rows_thread

ROW_SLOTS = 4
groups = {pool_replica.CONTROL_GROUP: pool_replica.CONTROL_CALLS}  # as engine_pool makes a replica
replica = ray.remote(concurrency_groups=groups)(HeldReplica).options(max_concurrency=ROW_SLOTS).remote()
ray.get(replica.attach.remote("busy", 60.0))
rows = [replica.generate.remote({"source": f"r:{i}"}, "busy", False) for i in range(ROW_SLOTS)]
time.sleep(1.0)  # every slot of the rows' group is held
seconds = {}
started = time.monotonic()
attached = ray.get(replica.attach.remote("other", 60.0), timeout=30)
seconds["attach"] = time.monotonic() - started
healthy = ray.get(replica.health.remote(), timeout=30)
seconds["health"] = time.monotonic() - started - seconds["attach"]
released = ray.get(replica.release.remote("busy"), timeout=30)  # cancels busy's rows on the rows' loop
cancelled = 0
for row in rows:
    try:
        ray.get(row, timeout=30)
    except ray.exceptions.TaskCancelledError:
        cancelled += 1
    except ray.exceptions.RayTaskError as err:
        cancelled += "CancelledError" in str(err)
ray.kill(replica)
part_done(({"in_flight_when_attached": attached["in_flight"], "leases_when_healthy": healthy["leases"],
                  "released": released, "cancelled": cancelled, "seconds": seconds}))
"""


_GIVE_WAY = """
import asyncio, time
import ray
from airflow_provider_raybatch.pipeline.generate import pool_replica
from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

class Engine:  # Ray Data LLM's UDF, never called here
    pass

class IdleReplica(EngineReplica):  # the replica's own lifetime (its watch, its looks, its end), no engine
    def __init__(self):
        pool_replica._TICK_SECONDS = 0.1  # module constants of the actor's own process
        pool_replica.GIVE_WAY_AFTER_IDLE_SECONDS = 1.0
        pool_replica._GIVE_WAY_LOOK_SECONDS = 0.5
        self.__dict__.update(_engine=Engine(), _fingerprint="f", _engine_build_seconds=1.0,
                             _keep_warm_seconds=600.0, _engine_started_at=0.0, _engine_ready_at=1.0,
                             _leases={}, _in_flight={}, _rows_by_source={},
                             _jobs_served=[], _rows_done=0, _rows_by_job={},
                             _watch=None, _retiring=False, _chat_templates={}, _job_templates={},
                             _last_active=time.monotonic(), _job_share=4, _shares={})
        self._loop = asyncio.get_running_loop()

@ray.remote(num_cpus=0)
class Foreign:  # another team's actor: it knows nothing of pools
    def ping(self):
        return "placed"

def alive(actor, seconds):
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=seconds)
        return True
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
        return False

groups = {pool_replica.CONTROL_GROUP: pool_replica.CONTROL_CALLS}
replica = ray.remote(concurrency_groups=groups)(IdleReplica).options(
    num_cpus=1, resources={"slot": 2}, max_concurrency=4).remote()  # 1 of 2 CPUs, 2 of 3 slots
ray.get(replica.attach.remote("earlier-job", 600.0))
ray.get(replica.release.remote("earlier-job"))
# Idle, and what waits could never be placed on this node, ending the replica or not; or waits for
# CPUs alone (a GPU engine's CPU is no reason for it to end).
never = Foreign.options(resources={"slot": 4}).remote()
cpus = Foreign.options(num_cpus=2).remote()
time.sleep(4.0)
kept_for_the_impossible_and_cpus = alive(replica, 5)
ray.kill(cpus)
# A job holds it: it stays, though a foreign actor waits for its slots.
ray.get(replica.attach.remote("running-job", 600.0))
waiting = Foreign.options(resources={"slot": 2}).remote()
time.sleep(4.0)
kept_while_leased = alive(replica, 5)
not_placed_while_leased = not alive(waiting, 0.5)
ray.get(replica.release.remote("running-job"))
released = time.monotonic()
placed = ray.get(waiting.ping.remote(), timeout=60)
part_done({"kept_for_the_impossible_and_cpus": kept_for_the_impossible_and_cpus,
           "kept_while_leased": kept_while_leased,
           "not_placed_while_leased": not_placed_while_leased, "placed": placed,
           "placed_after_release_s": round(time.monotonic() - released, 1),
           "replica_ended": not alive(replica, 5)})
ray.kill(never)
ray.kill(waiting)
"""


def test_an_idle_replica_gives_way_to_work_that_knows_nothing_of_pools(on_cluster: dict) -> None:
    """An actor of no pool of ours waits for what an idle replica holds: the replica ends and the actor
    is placed, within seconds of the replica's last job leaving it, not after ``keep_warm_seconds``
    (600 s here). A replica a job holds stays; work the node could never host, or that waits for CPUs
    alone, ends nothing."""
    report = part_report(on_cluster, "give_way")
    assert report["kept_for_the_impossible_and_cpus"] is True
    assert report["kept_while_leased"] is True and report["not_placed_while_leased"] is True
    assert report["placed"] == "placed" and report["replica_ended"] is True
    # idle 1 s, two looks 0.5 s apart, the raylet's report of usage a second or so behind
    assert report["placed_after_release_s"] < 30


def test_a_stage_actor_keeps_a_bounded_number_of_rows_waiting_on_the_replicas(stage_report: dict) -> None:
    """A replica's row calls are shared by every job: one stage actor's batches never hold more than
    ROWS_IN_FLIGHT_PER_STAGE_ACTOR of them (2 here), and every row still comes back."""
    assert stage_report["capped"] == {"rows": 9, "most": 2}


def test_a_stage_actor_keeps_a_bounded_number_of_bytes_waiting_on_a_shared_replica(
    stage_report: dict,
) -> None:
    """A shared replica holds each row sent to it until the engine answers: a count alone let 2,048
    rows near the input bound (32 MiB each) put 64 GiB in a replica other DAGs' rows share. Rows of
    10 KB under a 25 KB bound: two at a time, and every row still comes back."""
    assert stage_report["bytes_capped"] == {"rows": 8, "most": 20_000}


def test_rows_of_a_batch_that_failed_are_cancelled_in_the_replica(stage_report: dict) -> None:
    """A batch gives up its other rows when one fails: their calls are cancelled in the replica too,
    which else kept generating (and holding) rows their places in flight no longer counted."""
    assert stage_report["given_up"] == {"failed": "the replica refused the row", "cancelled": 2}


def test_a_job_with_every_row_slot_taken_leaves_the_control_calls_free(on_cluster: dict) -> None:
    """A replica whose rows hold all its slots (a job with thousands of rows in flight) still answers
    another job's attach, a driver's health check and a release at once: they have a concurrency group of
    their own, and run on the rows' loop, where the replica's state and engine are."""
    report = part_report(on_cluster, "control")
    assert report["in_flight_when_attached"] == 4  # every slot was taken when the attach came
    assert report["leases_when_healthy"] == 2
    assert max(report["seconds"].values()) < 10, report["seconds"]
    assert report["released"] == {"rows": 0}
    assert report["cancelled"] == 4  # the release cancelled the busy job's rows in the rows' loop


def test_a_dead_replica_is_replaced_and_its_rows_sent_again_within_the_restart_budget(
    stage_report: dict,
) -> None:
    report = stage_report
    one = report["one_death"]
    # One row found the replica dead: a new one took its name and answered it; every row once.
    assert one["made"] == 2 and sum(text.startswith("actor-1 ") for text in one["rows"]) >= 1
    assert sorted(text.split()[1] for text in one["rows"]) == ["a:0", "a:1", "a:2"]
    too_many = report["too_many"]
    assert "died; replicas were replaced 2 times already (RAYBATCH_ENGINE_MAX_RESTARTS)" in too_many["error"]
    assert "Its last error: The actor experienced an error before finishing this task." in too_many["error"]
    # A setting vLLM refuses only as it builds was built four times, and the task
    # never said why. The second build failing alike ends it, quoting the engine's own line.
    alike = report["build_fails_alike"]
    assert alike["made"] <= too_many["made"], (alike, too_many)  # never more builds than the budget's
    assert re.match(
        r"Engine pool replica raybatch-engine-f-0 failed to build twice with the same error: "
        r"EngineBuildError: ValueError: No available memory for the cache blocks \(pid 40(0[2-9]|1\d)\)\.",
        alike["error"],
    ), alike["error"]  # a later build's pid than the first's (4001): still the same error
    # The job's own error led with Ray's wrapper and ended "a retry resumes from them",
    # which a retry with the same settings meets again. It now leads with the refusal.
    assert report["stage_failed"].startswith(
        "The engine stage failed: PoolReplicaLost: Engine pool replica raybatch-engine-f-0 failed to "
        "build twice with the same error: EngineBuildError: ValueError: No available memory"
    ), report["stage_failed"]
    assert "A retry with the same settings fails the same way" in report["stage_failed"]
    assert "a retry resumes" not in report["stage_failed"]
    # A replica that died mid-run, past the restart budget: a retry may well go through, and resumes.
    assert report["stage_died"].startswith("The engine stage failed: PoolReplicaLost: Engine pool replica ")
    assert report["stage_died"].endswith(
        "is in the Ray dashboard's actor logs. The rows already generated are staged: a retry resumes "
        "from them."
    )  # one full stop, and the restart budget said once
    # One build failed (no pool, where Ray Data starts the actor again): a setting, or a passing fault.
    once = report["stage_built_once"]
    assert once.startswith(
        "The engine stage failed: EngineBuildError: ValueError: CUDA out of memory. (vLLM's"
    )
    assert "a setting it refuses (engine_kwargs, the model, the resources) fails every retry alike" in once
    assert "fails the same way" not in once and once.endswith("a retry resumes from them.")
    # The replica was found dead by the stage's own attach (before any row): replaced the same way.
    on_attach = report["dead_on_attach"]
    assert on_attach["made"] == 2 and on_attach["rows"] == ["actor-1 a:0", "actor-1 a:1", "actor-1 a:2"]


def test_an_actor_of_the_replicas_name_serving_another_engine_gets_no_row(stage_report: dict) -> None:
    """The replica's name carries the pool's fingerprint; an actor of that name answering with another
    (made outside this provider) fails the stage before any row goes to it, and is left running."""
    foreign = stage_report["foreign"]
    assert foreign["generated"] == 0 and foreign["made"] == 1, foreign
    assert foreign["error"] == (
        "Engine pool replica raybatch-engine-f-0 serves another engine (fingerprint '0123456789abcdef', "
        "this job's 'f'): no row was sent to it. An actor of that name was made outside this provider; "
        "end it (ray.kill) or run the job without keep_warm_seconds."
    )


def test_a_replica_unreachable_for_a_moment_is_tried_again_not_replaced(stage_report: dict) -> None:
    """CI's failure at dacedb2: a live replica Ray called unavailable on a loaded machine was replaced."""
    report = stage_report
    # Eight "unavailable" answers among three rows: the same replica answered each row once, no new one.
    unreachable = report["unreachable"]
    assert unreachable["made"] == 1 and unreachable["rows"] == ["actor-0 a:0", "actor-0 a:1", "actor-0 a:2"]
    # Unavailable at attach (twice): attached once it answered, then served every row.
    on_attach = report["unreachable_on_attach"]
    assert on_attach["made"] == 1 and on_attach["attached"] == [1]
    assert on_attach["rows"] == ["actor-0 a:0", "actor-0 a:1", "actor-0 a:2"]
    # Unavailable past the grace (0.5 s here): counted as dead and replaced, and the row still answered.
    past = report["unreachable_past_grace"]
    assert past["replaced"] == 1 and past["made"] >= 2 and past["rows"] == [f"actor-{past['made'] - 1} a:0"]
    # Three rows past the grace together: one replacement, and the new replica gets its own grace
    # (else the other rows' spent windows replace it at once, and the budget runs out).
    three = report["three_rows_past_grace"]
    assert three["replaced"] == 1, three
    assert sorted(text.split()[1] for text in three["rows"]) == ["a:0", "a:1", "a:2"]


_HEALTH = """
import json
import ray
from airflow_provider_raybatch.pipeline.generate.engine_pool import NAMESPACE, PoolLease

@ray.remote(num_cpus=0)
class Replica:  # EngineReplica's health check: answers, fails, or Ray cannot reach it for now
    def __init__(self, mode):
        self.mode = mode
    def health(self):
        if self.mode == "unreachable":
            raise ray.exceptions.ActorUnavailableError("connection reset", None)
        if self.mode == "sick":
            raise RuntimeError("EngineCore died")
        return True

modes = {"raybatch-engine-h-0": "healthy", "raybatch-engine-h-1": "unreachable",
         "raybatch-engine-h-2": "sick"}
handles = [Replica.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(mode)
           for name, mode in modes.items()]
ray.get([handle.__ray_ready__.remote() for handle in handles])
lease = object.__new__(PoolLease)
lease.__dict__.update(_warm=sorted(modes), _replaced=[])
lease._replace_unhealthy()
named = {entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)}
part_done(({"warm": lease._warm, "replaced": lease._replaced, "alive": sorted(named & set(modes))}))
"""


def test_rows_cancelled_by_a_lapsed_lease_are_sent_again_after_attaching_again(stage_report: dict) -> None:
    """A replica cancels a job's rows when the job's lease lapses there (a driver that stalled past
    LEASE_SECONDS); the job is alive, so its rows must not fail the stage."""
    report = stage_report
    lapsed = report["lease_lapsed"]
    # Two rows came back cancelled: the stage attached again (renewing the lease; once per cancelled
    # row at most) and each row was answered once, by the same replica, none replaced.
    assert lapsed["made"] == 1 and 2 <= lapsed["attached"][0] <= 3, lapsed
    assert lapsed["rows"] == ["actor-0 a:0", "actor-0 a:1", "actor-0 a:2"]
    # A lease that keeps lapsing is not a passing stall: the stage fails, saying why.
    keeps = report["lease_keeps_lapsing"]
    assert "cancelled a row 4 times because this job's lease on it lapsed" in keeps["error"], keeps
    assert keeps["made"] == 1


def test_the_health_check_kills_a_sick_replica_but_not_one_ray_cannot_reach_for_now(on_cluster: dict) -> None:
    """A replica Ray called unavailable at the lease's health check was killed,
    though it may be live and serving other jobs' rows."""
    report = part_report(on_cluster, "health")
    assert report["warm"] == ["raybatch-engine-h-0"]  # only the one that answered counts warm
    assert report["replaced"] == ["raybatch-engine-h-2"]  # the sick one is killed and replaced
    assert report["alive"] == ["raybatch-engine-h-0", "raybatch-engine-h-1"]  # the unreachable one lives


_ROUTING = """
import asyncio, json, socket, time
import ray
from airflow_provider_raybatch.pipeline.generate import pooled_stage
from airflow_provider_raybatch.pipeline.generate.engine_pool import NAMESPACE, UP_ANSWER_SECONDS, EnginePool

@ray.remote(num_cpus=0)
class BuildingReplica:  # EngineReplica's protocol; its engine takes build_seconds to build
    def __init__(self, index, build_seconds, fingerprint):
        self.index, self.fingerprint = index, fingerprint
        time.sleep(build_seconds)
    def attach(self, job_id, keep_warm, chat_template=None):
        return {"fingerprint": self.fingerprint}
    def generate(self, row, job_id, render):
        return {"__idx_in_batch": row["__idx_in_batch"], "generated_text": f"replica-{self.index}"}

class Pool(EnginePool):
    def replica(self, index):
        return BuildingReplica.options(name=self.names[index], namespace=NAMESPACE, get_if_exists=True
                                       ).remote(index, self.engine_kwargs["build"][index], self.fingerprint)

def client_of(pool, first):
    client = object.__new__(pooled_stage._PoolClient)
    client.__dict__.update(data_column="__data", expected_input_keys=set(), _pool=pool, _job_id="job",
                           _handles={}, _attached={}, _built={}, _dead=set(), _next=first, _replaced=0,
                           _max_replaced=2, _render_in_pool=True)
    return client

async def served(pool, first, batches, heard_from_all=False, together=False):
    client = client_of(pool, first)
    if heard_from_all:  # first hear from every replica (on a loaded machine an answer can take seconds)
        await asyncio.gather(*(client._built_task(index) for index in range(pool.replicas)))
    async def one(number):
        rows = [{"source": f"{number}:{i}", "__idx_in_batch": i} for i in range(3)]
        return sorted({row["generated_text"] async for row in client.udf(rows)})
    if together:  # as Ray Data runs a stage actor's batches: several at once (max_concurrency)
        return sorted(await asyncio.gather(*(one(number) for number in range(batches))))
    return [await one(number) for number in range(batches)]

# Half warm: replica 0 is built, replica 1 builds for 600 s. Each batch, from replica 1's turn on,
# goes to replica 0 (none waits for the build).
half = Pool("half", 2, {"build": [0, 600]}, {}, None, 0.0)
ray.get(half.replica(0).__ray_ready__.remote())
half_warm = asyncio.run(served(half, 1, 4))
building = not ray.wait([ray.get_actor(half.names[1], namespace=NAMESPACE).__ray_ready__.remote()],
                        timeout=0)[0]
# Both built: batches take turns.
both = Pool("both", 2, {"build": [0, 0]}, {}, None, 0.0)
ray.get([both.replica(index).__ray_ready__.remote() for index in range(2)])
both_built = asyncio.run(served(both, 1, 4, heard_from_all=True))
# None built yet: the batch goes to the first replica to be built (replica 1, in 1 s; replica 0 in 600 s).
cold = Pool("cold", 2, {"build": [600, 1]}, {}, None, 0.0)
cold_first = asyncio.run(served(cold, 0, 2))
# A fresh stage actor's batches, all at once (a small warm job's every batch once went to
# one replica). Both built: they share them. Both building, ready 0.3 s apart: they share them too.
# Both built answer at once, however long a loaded machine takes to pass their answers on: the wait for
# every answer is lengthened so that what is tested is the sharing, not the machine's load.
pooled_stage.UP_ANSWER_SECONDS = 60.0
warm_together = asyncio.run(served(both, 0, 4, together=True))
pooled_stage.UP_ANSWER_SECONDS = UP_ANSWER_SECONDS
close = Pool("close", 2, {"build": [4, 4.3]}, {}, None, 0.0)
cold_together = asyncio.run(served(close, 0, 4, together=True))
part_done(({"half_warm": half_warm, "still_building": building, "both_built": both_built,
                  "cold_first": cold_first, "warm_together": warm_together,
                  "cold_together": cold_together}))
"""


def test_a_batch_goes_to_a_built_replica_never_to_one_still_building(on_cluster: dict) -> None:
    """A half-warm pool: rows sent to the replica still building waited out its build.
    A small job: one replica took every batch that a stage actor ran at once."""
    report = part_report(on_cluster, "routing")
    assert report["still_building"] is True
    assert report["half_warm"] == [["replica-0"]] * 4  # replica 1's turns went to replica 0
    assert report["both_built"] == [["replica-1"], ["replica-0"], ["replica-1"], ["replica-0"]]  # turns
    assert report["cold_first"] == [["replica-1"]] * 2
    assert report["warm_together"] == [["replica-0"]] * 2 + [["replica-1"]] * 2  # each takes two of four
    assert report["cold_together"] == [["replica-0"]] * 2 + [["replica-1"]] * 2


_RENDER = """
import json
from airflow_provider_raybatch.pipeline.generate.pool_replica import EngineReplica

class Template:  # our chat-template UDF's rendering; a conversation with no user turn is refused
    def __init__(self, joiner="|"):
        self.joiner = joiner
    def _render(self, conversation):
        if not any(turn["role"] == "user" for turn in conversation):
            raise ValueError("no user message")
        return self.joiner.join(f"{turn['role']}:{turn['content']}" for turn in conversation)

class Engine:
    IDX_IN_BATCH_COLUMN = "__idx_in_batch"
    async def _generate_with_error_handling(self, row, batch_uuid):
        return {"generated_text": "from " + row["prompt"], "messages_left": row.get("messages") is not None}

from airflow_provider_raybatch.pipeline.generate import pool_replica
replica = object.__new__(EngineReplica)
replica.__dict__.update(_engine=Engine(), _chat_templates={}, _job_templates={}, _retiring=False,
                        _in_flight={}, _rows_by_source={},
                        _shares={}, _job_share=4, _rows_done=0, _rows_by_job={},
                        _own_model=pool_replica._ModelOfEngine("m", False, None))
import asyncio
loaded = []
pool_replica._chat_template_udf = lambda settings: loaded.append(settings) or Template(settings["joiner"])
for job, joiner in (("job", "|"), ("other job", " / "), ("job again", "|")):
    asyncio.run(replica._hold_chat_template(job, {"joiner": joiner, "model": "m"}))
good = {"__idx_in_batch": 0, "messages": json.dumps([{"role": "user", "content": "hi"}])}
bad = {"__idx_in_batch": 1, "messages": json.dumps([{"role": "system", "content": "only"}])}
own = {"__idx_in_batch": 2, "messages": None, "prompt": "my own prompt"}
report = {"good": [replica._render(good, "job"), good], "bad": replica._render(bad, "job")}
# Each job with its own chat template; a job that sent none (a completions job) renders nothing.
two_turns = json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
other = {"__idx_in_batch": 4, "messages": two_turns}
unrendered = {"__idx_in_batch": 5, "messages": two_turns}
report["other"] = [replica._render(other, "other job"), other["prompt"]]
report["no_template"] = [replica._render(unrendered, "completions job"), "prompt" in unrendered]
report["loaded"] = [settings["joiner"] for settings in loaded]  # once per distinct settings
# A job that rendered its rows itself (a batch with images) sends them with their messages still on.
by_the_job = {"__idx_in_batch": 3, "messages": json.dumps([{"role": "user", "content": "hi"}]),
              "prompt": "job's"}
import asyncio
report["by_the_job"] = asyncio.run(replica.generate(by_the_job, "job", render=False))
part_done(({**report, "own": [replica._render(own, "job"), own]}))
"""


def test_a_replica_renders_the_chat_template_and_a_bad_conversation_is_the_rows_error(
    without_cluster: dict,
) -> None:
    """On a warm pool the replica applies the chat template (the job starts no chat-template actor)."""
    report = part_report(without_cluster, "render")
    assert report["good"] == [
        None,
        {"__idx_in_batch": 0, "prompt": "user:hi"},
    ]  # rendered; the engine goes on
    assert report["bad"] == {
        "__idx_in_batch": 1,
        "prompt": "",
        "num_input_tokens": 0,
        "__inference_error__": "raybatch row error: chat template failed: ValueError: no user message",
    }
    assert report["own"] == [None, {"__idx_in_batch": 2, "messages": None, "prompt": "my own prompt"}]
    # Rendered by the job's own stage: the engine gets the job's prompt, not a second rendering.
    assert report["by_the_job"] == {"generated_text": "from job's", "messages_left": True}
    # Two jobs' chat templates on one replica, each loaded once; a job with none has its rows unrendered.
    assert report["other"] == [None, "system:be brief / user:hi"]
    assert report["no_template"] == [None, False]
    assert report["loaded"] == ["|", " / "]


_LEASE = """
import json, os, socket, threading, time
import ray
from airflow_provider_raybatch.pipeline.generate import engine_pool
from airflow_provider_raybatch.pipeline.generate.engine_pool import NAMESPACE, EnginePool, PoolLease
from airflow_provider_raybatch.pipeline.generate.cluster_demand import would_make_room

engine_pool.MAKE_ROOM_AFTER_SECONDS = 0.5

@ray.remote
class FakeReplica:  # EngineReplica's protocol, with an engine that takes build_seconds to build
    def __init__(self, build_seconds, fingerprint):
        self.fingerprint = fingerprint
        self.started = time.time()
        time.sleep(build_seconds)
        self.ready = time.time()
        self.leases = set()
    def attach(self, job_id, keep_warm, chat_template=None):
        self.leases.add(job_id)
        return {"fingerprint": self.fingerprint, "engine_started_at": self.started,
                "engine_ready_at": self.ready, "engine_build_seconds": round(self.ready - self.started, 3)}
    def release(self, job_id):
        self.leases.discard(job_id)
        return {"rows": 7}
    def retire_if_idle(self, lacking=None):  # as EngineReplica's: only if its end makes room
        context = ray.get_runtime_context()
        where = (context.get_node_id(), context.get_assigned_resources())
        if self.leases or (lacking is not None and not would_make_room(lacking, *where)):
            return False
        threading.Timer(0.2, os._exit, (0,)).start()  # as the replica: ends a moment after answering
        return True

class Pool(EnginePool):
    def replica(self, index):
        return FakeReplica.options(name=self.names[index], namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True, **self.actor_options
                                   ).remote(self.engine_kwargs["build"][index], self.fingerprint)

def pool(fingerprint, replicas, build):  # build: seconds, or each replica's
    builds = build if isinstance(build, list) else [build] * replicas
    options = {"num_cpus": 0, "resources": {"slot": 1}}
    return Pool(fingerprint, replicas, {"build": builds}, options, None, 0.0)

def lease_of(pool):
    lease = PoolLease(pool).start()
    while lease.describe()["replicas_ready_s"] is None:
        time.sleep(0.2)
    lease.stop()
    return lease.describe()

def alive():
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted(e["name"] for e in named if e["namespace"] == NAMESPACE)

idle = pool("other", 1, 0.0)
ray.get(idle.replica(0).attach.remote("earlier-job", 0.0))
ray.get(ray.get_actor(idle.names[0], namespace=NAMESPACE).release.remote("earlier-job"))
# Two replicas fit beside the other pool's idle one: they build for 3 s with every slot taken, and
# nothing of the other pool is ended (it is not in their way).
placed = lease_of(pool("mine", 2, 3.0))
after_placed = alive()
# A third replica of another pool does not fit until the idle one goes: the lease makes room.
for name in after_placed:
    if "mine" in name:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))
time.sleep(1)
crowded = lease_of(pool("third", 3, 0.5))
after_crowded = alive()
# The job ends (on replica 0) while replica 1 still builds: the lease's end does not wait for it.
for name in after_crowded:
    ray.kill(ray.get_actor(name, namespace=NAMESPACE))
time.sleep(1)
half = pool("half", 2, [0.0, 120.0])
lease = PoolLease(half).start()
ray.get(lease._attaching[0])
lease.stop()
building_after_stop = not engine_pool._is_up(ray.get_actor(half.names[1], namespace=NAMESPACE))
part_done(({"placed": placed, "after_placed": after_placed, "crowded": crowded,
                  "after_crowded": after_crowded, "half": lease.describe(),
                  "building_after_stop": building_after_stop}))
"""


def test_a_lease_reports_each_replicas_start_and_makes_room_only_for_a_replica_that_waits(
    on_cluster: dict,
) -> None:
    report = part_report(on_cluster, "lease")
    placed = report["placed"]
    # Both replicas were built for this job, side by side: their readiness is timed and compared.
    assert [entry["replica"] for entry in placed["replica_timings"]] == [0, 1]
    assert all(entry["engine_build_seconds"] >= 3.0 for entry in placed["replica_timings"])
    # Started for this job (after its lease began); how far apart they became ready, from their own
    # clocks (both build 3 s: apart by no more than their workers' starts, slow on a loaded machine).
    assert all(entry["engine_start_s"] >= 0 for entry in placed["replica_timings"])
    ready = [entry["engine_ready_s"] for entry in placed["replica_timings"]]
    assert placed["replica_ready_skew_s"] == pytest.approx(max(ready) - min(ready), abs=0.002)
    # While they built, every slot was taken, yet the other pool's idle replica was left alone.
    assert placed["ended_for_room"] == [] and "raybatch-engine-other-0" in report["after_placed"]
    # A replica that could not be placed: the idle replica of the other pool was ended for it.
    crowded = report["crowded"]
    assert crowded["ended_for_room"] == ["raybatch-engine-other-0"]
    assert "raybatch-engine-other-0" not in report["after_crowded"]
    # The third replica started only once room was made, at least MAKE_ROOM_AFTER_SECONDS (0.5 s) into the
    # lease. (Not the skew of their readiness: on a loaded machine the first two's worker processes can
    # start as late as the third, 0.06 s apart.)
    assert max(entry["engine_start_s"] for entry in crowded["replica_timings"]) >= 0.5
    # A job that ended on replica 0 while replica 1 still built (its end used to wait ~10 s
    # for replica 1): the lease let go at once; each replica says how many of the job's rows it answered.
    assert report["building_after_stop"] is True
    half = report["half"]
    assert [(t["replica"], t["answered"], t["rows"]) for t in half["replica_timings"]] == [
        (0, True, 7),
        (1, False, 0),
    ]
    assert half["replica_timings"][1]["building_at_job_end"] is True and half["replicas_ready_s"] is None


def test_the_needs_of_a_jobs_own_replica_come_from_its_engine_stage() -> None:
    from airflow_provider_raybatch.pipeline.generate.stage_swap import own_replica_needs

    class vLLMEngineStage:  # noqa: N801 - Ray Data LLM's, which its processor names its stage after
        def __init__(self, kwargs):
            self.map_batches_kwargs = kwargs

    class Processor:
        def __init__(self, kwargs):
            self.stages = {"ChatTemplateStage": object(), "vLLMEngineStage": vLLMEngineStage(kwargs)}

    assert own_replica_needs(Processor({"num_gpus": 1, "accelerator_type": "H100", "concurrency": 2})) == {
        "GPU": 1.0,
        "accelerator_type:H100": 0.001,
    }
    assert own_replica_needs(Processor({"ray_remote_args_fn": object(), "num_gpus": 0})) == {}


def test_room_is_made_on_a_node_that_could_host_the_replica_never_by_the_clusters_sum() -> None:
    """An A100 job waits while idle replicas hold the A100 node's GPU and an H100 node's: ending the
    H100 one would make the cluster's sum fit and free nothing the job can use."""

    needs = {"GPU": 1.0, "accelerator_type:A100": 0.001}
    nodes = {
        "a100": (
            {"GPU": 1.0, "CPU": 8.0, "accelerator_type:A100": 1.0},
            {"GPU": 0.0, "CPU": 7.0, "accelerator_type:A100": 1.0},
        ),
        "h100": (
            {"GPU": 1.0, "CPU": 8.0, "accelerator_type:H100": 1.0},
            {"GPU": 0.0, "CPU": 7.0, "accelerator_type:H100": 1.0},
        ),
        "half": ({"GPU": 1.0, "accelerator_type:A100": 1.0}, {"GPU": 0.5, "accelerator_type:A100": 1.0}),
    }
    lacking = lacking_by_node(needs, nodes)
    assert lacking == {"a100": ["GPU"], "half": ["GPU"]}  # the H100 node can never host it
    assert would_make_room(lacking, "a100", {"GPU": 1.0, "CPU": 1.0})
    assert would_make_room(lacking, "half", {"GPU": 0.5})  # half a GPU more there is a whole one
    assert not would_make_room(lacking, "h100", {"GPU": 1.0})
    assert not would_make_room(lacking, "a100", {"CPU": 1.0})
    assert (
        lacking_by_node(
            needs,
            {
                **nodes,
                "free": (
                    {"GPU": 1.0, "accelerator_type:A100": 1.0},
                    {"GPU": 1.0, "accelerator_type:A100": 1.0},
                ),
            },
        )["free"]
        == []
    )
