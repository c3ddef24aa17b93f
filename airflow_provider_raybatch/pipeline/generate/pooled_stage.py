"""The engine stage of a job on a warm pool: sends its rows to the pool's replicas, stages what returns.

It takes the place of the vLLM stage's UDF in Ray Data LLM's processor (:func:`.engine.use_engine_pool`)
and reserves no GPU: the pool's replicas hold the engines (:mod:`.engine_pool`). Like a job's own
replica it stages each row as it finishes (:class:`.StagesFinishedRows`), so a retry resumes from the
same parts. It never imports vLLM or torch, which is what lets a warm job's first row come seconds
after its start instead of after an engine build.

Each batch goes to one replica, the next batch to the next (from a random first one): a job's stage
actors spread their batches over the pool. A replica that dies mid-batch (its engine crashed, the
node went, it was replaced) is replaced here, and its rows of the batch are sent again; commit keeps
one copy of a row staged twice. After ``RAYBATCH_ENGINE_MAX_RESTARTS`` replacements in one stage
actor the stage fails, and the job with it, saying so.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray.llm._internal.batch.stages.base import StatefulStageUDF

from airflow_provider_raybatch.pipeline.generate import engine
from airflow_provider_raybatch.pipeline.generate.engine_pool import EnginePool
from airflow_provider_raybatch.pipeline.generate.staged_udf import StagesFinishedRows


class PoolReplicaLost(RuntimeError):
    """The pool's replicas died more often than a stage may replace them."""


class _PoolClient(StatefulStageUDF):
    """Ray Data LLM's stage UDF protocol, answered by the pool's replicas row by row."""

    def __init__(
        self,
        data_column: str,
        expected_input_keys: list[str],
        raybatch_pool: EnginePool,
        **_: Any,  # Any: the stage's other keywords (task_type): the pool's engine has them
    ) -> None:
        super().__init__(data_column, expected_input_keys)
        self._pool = raybatch_pool
        self._job_id = ray.get_runtime_context().get_job_id()
        self._handles: dict[int, Any] = {}  # Any: Ray actor handles, by replica index
        self._dead: set[Any] = set()  # Any: the Ray actor ids of replicas seen dead
        self._next = random.randrange(raybatch_pool.replicas)
        self._replaced = 0
        self._max_replaced = engine.engine_max_restarts()

    async def udf(self, batch: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:  # Any: row values.
        index, self._next = self._next, (self._next + 1) % self._pool.replicas
        tasks = [asyncio.create_task(self._generate(row, index)) for row in batch]
        try:
            for finished in asyncio.as_completed(tasks):
                yield await finished
        finally:
            for task in tasks:
                task.cancel()

    async def _generate(self, row: dict[str, Any], index: int) -> dict[str, Any]:  # Any: row values.
        while True:
            handle, new = await self._replica(index)
            try:
                if new:  # a replica this actor has not used yet (the first, or a replacement): hold it
                    await handle.attach.remote(self._job_id, self._pool.keep_warm_seconds)
                return await handle.generate.remote(row, self._job_id)
            except ray.exceptions.RayActorError as err:
                self._replace(index, handle, err)

    async def _replica(self, index: int) -> tuple[Any, bool]:  # Any: a Ray actor handle
        """The replica at ``index``, and whether it is new to this actor."""
        handle: Any = self._handles.get(index)  # Any: a Ray actor handle
        if handle is not None:
            return handle, False
        handle = self._pool.replica(index)  # the live replica of that name, or a new one
        for _ in range(100):  # until Ray has freed a dead replica's name (it does as the actor dies)
            if handle._actor_id not in self._dead:
                break
            await asyncio.sleep(0.2)
            handle = self._pool.replica(index)
        if index in self._handles:  # another row of the batch got one while this one waited
            return self._handles[index], False
        self._handles[index] = handle  # the batch's other rows take this one
        return handle, True

    def _replace(self, index: int, dead: Any, err: BaseException) -> None:  # Any: a Ray actor handle
        if self._handles.get(index) is not dead:
            return  # another row of this actor replaced it already
        del self._handles[index]
        self._dead.add(getattr(dead, "_actor_id", None))
        self._replaced += 1
        if self._replaced > self._max_replaced:
            raise PoolReplicaLost(
                f"Engine pool replica {self._pool.names[index]} died; replicas were replaced "
                f"{self._replaced - 1} times already ({engine.ENGINE_MAX_RESTARTS_ENV}). Its own error "
                "(for example an EngineCore traceback) is in the Ray dashboard's actor logs."
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
        raybatch_staging: dict[str, Any],  # Any: PartWriter keywords plus "spec"
        **kwargs: Any,  # Any: the stage's other keywords
    ) -> None:
        super().__init__(data_column, expected_input_keys, raybatch_pool, **kwargs)
        self._start_staging(raybatch_staging)
