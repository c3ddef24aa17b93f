"""The engine stage of a job on a warm pool: sends its rows to the pool's replicas, stages what returns.

It takes the place of the vLLM stage's UDF in Ray Data LLM's processor (:func:`.stage_swap.swap_stages`)
and reserves no GPU: the pool's replicas hold the engines (:mod:`.engine_pool`). Like a job's own
replica it stages each row as it finishes (:class:`.StagesFinishedRows`), so a retry resumes from the
same parts. It never imports vLLM or torch, which is what lets a warm job's first row come seconds
after its start instead of after an engine build.

Each batch goes to one replica, the next batch to the next (from a random first one): a job's stage
actors spread their batches over the pool. Only a replica whose engine is built takes a batch while
another is: in a half-warm pool (one replica warm, one building) the warm one takes every batch until
the other is ready, instead of half the rows waiting out a build (a minute on a GPU). With none
built yet, the batch goes to whichever is ready first, after a moment's wait for the others (replicas
started together are ready within seconds of each other, and a small job's batches are then shared).

A replica that dies mid-batch (its engine crashed, the node went, it was replaced) is replaced here,
and its rows of the batch are sent again; commit keeps one copy of a row staged twice. After
``RAYBATCH_ENGINE_MAX_RESTARTS`` replacements in one stage actor the stage fails, and the job with it,
saying so. A replica Ray calls unavailable (unreachable for a moment, as on a loaded node) is alive: its
rows try it again for up to a minute before it counts as dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import ray
from ray.llm._internal.batch.stages.base import StatefulStageUDF

from airflow_provider_raybatch.pipeline.generate import engine
from airflow_provider_raybatch.pipeline.generate.engine_pool import UP_ANSWER_SECONDS, EnginePool
from airflow_provider_raybatch.pipeline.generate.rows_in_flight import RowsInFlight, row_bytes
from airflow_provider_raybatch.pipeline.generate.staged_udf import StagesFinishedRows
from airflow_provider_raybatch.shared.json_types import ArgValue, JsonObject, Kwargs, Row

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

#: How long a row keeps trying a replica Ray calls unavailable (not dead) before it is replaced, and how
#: often. Ray's GCS declares a lost node's actors dead within about 30 s, so a dead one rarely lasts this.
UNREACHABLE_GRACE_SECONDS = 60.0
UNREACHABLE_RETRY_SECONDS = 1.0
#: How long batches that waited for the first replica's build wait for the others' (the issue's replica
#: start skew target is 5 s), at most: see :meth:`_PoolClient._next_built_replica`.
BUILD_SKEW_GRACE_SECONDS = 5.0
#: How often one row may find its job's lease lapsed on a replica and be sent again before the stage
#: fails: a driver whose renewals keep missing is not a passing stall.
MAX_LEASE_LAPSES_PER_ROW = 3


class PoolReplicaLost(RuntimeError):
    """The pool's replicas died more often than a stage may replace them, or failed to build twice alike."""


#: A line of a traceback that names an exception: ``ValueError: No available memory ...``.
_DIGITS = re.compile(r"\d+")
#: The module path before an error's class name (``airflow_provider_raybatch.….EngineBuildError``).
_MODULE_PATH = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*:)")


def death_cause(err: BaseException) -> tuple[str, bool]:
    """Why a replica died, in one line (the last exception its traceback names), and whether it died
    building (an error in its constructor: Ray's ``actor_init_failed``).

    Why: a setting vLLM refuses only as it builds (``kv_cache_memory_bytes`` too small)
    was built four times and the task said only "died"; the reason was in the actor logs.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [_MODULE_PATH.sub("", line, count=1) for line in lines if engine.ERROR_LINE.match(line)]
    cause = (named or lines or [type(err).__name__])[-1][:600]
    return cause, bool(getattr(err, "actor_init_failed", False))


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else text + "."


def _cancel_in_replica(call: ObjectRef[Row]) -> None:
    """Cancel a row's call in the replica once its batch gave up on it (another row of the batch
    failed): else the replica kept generating, and holding, a row its place in flight no longer
    counted, and a retried batch put its rows in flight twice. (A row sent again after its replica
    was unreachable joins its first call there: :meth:`.pool_replica.EngineReplica.generate`.)"""
    with contextlib.suppress(Exception):  # it may have finished meanwhile
        ray.cancel(call)


class _PoolClient(StatefulStageUDF):
    """Ray Data LLM's stage UDF protocol, answered by the pool's replicas row by row."""

    #: Places for this actor's rows waiting on the replicas (:mod:`.rows_in_flight`), made at the
    #: first row, on the actor's loop.
    _rows_in_flight: RowsInFlight | None = None

    def __init__(
        self,
        data_column: str,
        expected_input_keys: list[str],
        raybatch_pool: EnginePool,
        raybatch_render_in_pool: bool = True,
        **_: ArgValue,  # the stage's other keywords (task_type): the pool's engine has them
    ) -> None:
        super().__init__(data_column, expected_input_keys)
        self._pool = raybatch_pool
        # False: this job's own chat-template stage rendered its rows (stage_swap.WarmPool).
        self._render_in_pool = raybatch_render_in_pool
        self._job_id = ray.get_runtime_context().get_job_id()
        self._handles: dict[int, ActorHandle] = {}
        # Ray actor ids -> this actor's attach to that replica (every row waits for it: a replica
        # serving another engine must get none of them)
        self._attached: dict[ray.ActorID, asyncio.Future[None]] = {}
        self._built: dict[int, asyncio.Task[None]] = {}  # by replica index: done once its engine is built
        self._dead: set[ray.ActorID] = set()
        self._next = random.randrange(raybatch_pool.replicas)
        self._replaced = 0
        self._max_replaced = engine.engine_max_restarts()
        self._last_build_failure: str | None = None  # death_cause of the last replica that died building

    async def udf(self, batch: list[Row]) -> AsyncIterator[Row]:
        index = await self._next_built_replica()
        tasks = [asyncio.create_task(self._generate(row, index)) for row in batch]
        try:
            for finished in asyncio.as_completed(tasks):
                yield await finished
        finally:
            for task in tasks:
                task.cancel()

    async def _next_built_replica(self) -> int:
        """The next replica in turn whose engine is built; with none built yet, the first to be.

        The turn is read after the waits, not before: an actor runs several batches at once, and batches
        that waited together must still take turns (else every batch of a small warm job went to
        one replica, each having read the same turn before its wait).
        """
        built = {index: self._built_task(index) for index in range(self._pool.replicas)}
        if not any(task.done() for task in built.values()):
            # A built replica answers within milliseconds: waiting for all of them (bounded) first keeps
            # a fresh stage actor's turns fair; then a batch waits only for the first build to finish.
            started = time.monotonic()
            await asyncio.wait(built.values(), timeout=UP_ANSWER_SECONDS)
            if not any(task.done() for task in built.values()):
                await asyncio.wait(built.values(), return_when=asyncio.FIRST_COMPLETED)
                # Replicas started together finish their builds within seconds of each other: a
                # moment's wait for the others lets them share the queued batches, instead of the
                # first one taking all of a small job. Bounded by the wait so far, so a warm pool that
                # was slow to answer does not wait on a replica that is building from scratch.
                grace = min(BUILD_SKEW_GRACE_SECONDS, time.monotonic() - started)
                await asyncio.wait(built.values(), timeout=grace)
        turn = [(self._next + step) % self._pool.replicas for step in range(self._pool.replicas)]
        index = next(index for index in turn if built[index].done())
        self._next = (index + 1) % self._pool.replicas
        return index

    def _built_task(self, index: int) -> asyncio.Task[None]:
        if index not in self._built:
            self._built[index] = asyncio.create_task(self._until_built(index))
        return self._built[index]

    async def _until_built(self, index: int) -> None:
        """Returns once replica ``index``'s constructor (its engine build) has returned, or it died: the
        row sent to a dead one finds it so and replaces it (:meth:`_generate`)."""
        handle = await self._replica(index)
        with contextlib.suppress(ray.exceptions.RayActorError):
            await handle.__ray_ready__.remote()

    async def _generate(self, row: Row, index: int) -> Row:
        unreachable: tuple[ray.ActorID, float] | None = None
        lapses = 0
        while True:
            handle = await self._replica(index)
            try:
                await self._attach(index, handle)
                if self._rows_in_flight is None:
                    self._rows_in_flight = RowsInFlight()
                async with self._rows_in_flight.admitted(row_bytes(row)):
                    call = handle.generate.remote(row, self._job_id, self._render_in_pool)
                    try:
                        return await call
                    except asyncio.CancelledError:
                        _cancel_in_replica(call)
                        raise
            except ray.exceptions.TaskCancelledError as err:
                # The replica cancelled this job's requests: the job's lease lapsed there (its driver's
                # renewals did not arrive within LEASE_SECONDS, as under a stalled driver). The job is
                # alive (this actor is its own), so attach again, which renews the lease, and send the
                # row again.
                lapses += 1
                if lapses > MAX_LEASE_LAPSES_PER_ROW:
                    raise PoolReplicaLost(
                        f"Engine pool replica {self._pool.names[index]} cancelled a row "
                        f"{lapses} times because this job's lease on it lapsed: the job's driver is not "
                        "renewing its leases (an overloaded or stalled driver node)."
                    ) from err
                self._attached.pop(handle._actor_id, None)
            except ray.exceptions.ActorUnavailableError as err:
                # Unreachable for a moment (a loaded node, a dropped connection), not dead: Ray says
                # ActorDiedError once it knows a replica is gone. Counting a live one as dead would
                # spend a turn of the restart budget, so the row tries the same one again. The grace
                # is each replica's own: one that another row put in a dead one's place starts anew.
                if unreachable is None or unreachable[0] != handle._actor_id:
                    unreachable = (handle._actor_id, time.monotonic())
                if time.monotonic() - unreachable[1] < UNREACHABLE_GRACE_SECONDS:
                    await asyncio.sleep(UNREACHABLE_RETRY_SECONDS)
                    continue
                self._replace(index, handle, err)
            except ray.exceptions.RayActorError as err:
                self._replace(index, handle, err)

    async def _attach(self, index: int, handle: ActorHandle) -> None:
        """Attach this job to the replica once per actor (the first row to it, or to a replacement); the
        batch's other rows wait for that attach and share its outcome. A failed attach is forgotten, so
        the next try attaches again."""
        attaching = self._attached.get(handle._actor_id)
        if attaching is None:
            attaching = asyncio.ensure_future(self._attach_once(index, handle))
            self._attached[handle._actor_id] = attaching
        try:
            await asyncio.shield(attaching)  # a row cancelled while it waits does not cancel the others'
        except BaseException:
            if attaching.done() and self._attached.get(handle._actor_id) is attaching:
                del self._attached[handle._actor_id]
            raise

    async def _attach_once(self, index: int, handle: ActorHandle) -> None:
        state = await handle.attach.remote(
            self._job_id, self._pool.keep_warm_seconds, self._pool.chat_template
        )
        self._refuse_another_engine(index, state)

    def _refuse_another_engine(self, index: int, state: JsonObject) -> None:
        """Stop before a row goes to an actor that holds the replica's name but serves another engine.

        The name carries the pool's fingerprint, so only an actor made outside this code (or a hash
        collision) answers with another: its rows would be generated by an engine the job never asked
        for. Not a guard against a tenant who can run code on the cluster: such a one can answer with
        any fingerprint (docs/security.md, "A shared Ray cluster").
        """
        answered = state.get("fingerprint") if isinstance(state, dict) else None
        if answered != self._pool.fingerprint:
            raise PoolReplicaLost(
                f"Engine pool replica {self._pool.names[index]} serves another engine (fingerprint "
                f"{str(answered)[:40]!r}, this job's {self._pool.fingerprint!r}): no row was sent to it. "
                "An actor of that name was made outside this provider; end it (ray.kill) or run the job "
                "without keep_warm_seconds."
            )

    async def _replica(self, index: int) -> ActorHandle:
        """The replica at ``index``: the one this actor holds, else the live one of its name or a new one."""
        handle: ActorHandle = self._handles.get(index)
        if handle is not None:
            return handle
        handle = self._pool.replica(index)  # the live replica of that name, or a new one
        for _ in range(100):  # until Ray has freed a dead replica's name (it does as the actor dies)
            if handle._actor_id not in self._dead:
                break
            await asyncio.sleep(0.2)
            handle = self._pool.replica(index)
        return self._handles.setdefault(index, handle)  # another row may have got one while this waited

    def _replace(self, index: int, dead: ActorHandle, err: BaseException) -> None:
        if self._handles.get(index) is not dead:
            return  # another row of this actor replaced it already
        del self._handles[index]
        self._built.pop(index, None)  # its replacement's build is waited for anew
        self._dead.add(getattr(dead, "_actor_id", None))
        self._replaced += 1
        cause, building = death_cause(err)
        # A setting, not a passing fault: no more builds. Compared without numbers (pids, addresses, bytes
        # measured), which differ from build to build of the same refused setting.
        alike = _DIGITS.sub("#", cause)
        if building and alike == self._last_build_failure:
            raise PoolReplicaLost(
                f"Engine pool replica {self._pool.names[index]} failed to build twice with the same error: "
                f"{_sentence(cause)} The engine refuses a setting (engine_kwargs, the model, the "
                "resources): fix it and retry. Its whole traceback is in the job's log and the Ray "
                "dashboard's actor logs."
            ) from err
        self._last_build_failure = alike if building else None
        if self._replaced > self._max_replaced:
            raise PoolReplicaLost(
                f"Engine pool replica {self._pool.names[index]} died; replicas were replaced "
                f"{self._replaced - 1} times already ({engine.ENGINE_MAX_RESTARTS_ENV}). Its last error: "
                f"{_sentence(cause)} The whole of it (for example an EngineCore traceback) is in the Ray "
                "dashboard's actor logs."
            ) from err


class RaybatchPooledEngineStageUDF(StagesFinishedRows, _PoolClient):
    """The vLLM stage's place in the processor, on a warm pool: rows out to the pool, staged as they return.

    The name keeps ``vLLMEngineStage`` out on purpose: nothing in this actor starts an engine.
    """

    def __init__(
        self,
        data_column: str,
        expected_input_keys: list[str],
        raybatch_pool: EnginePool,
        raybatch_staging: Kwargs,
        **kwargs: ArgValue,
    ) -> None:
        super().__init__(data_column, expected_input_keys, raybatch_pool, **kwargs)
        self._start_staging(raybatch_staging)
