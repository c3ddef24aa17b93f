"""The vLLM stage's UDF with a faster start (see :mod:`~airflow_provider_raybatch.pipeline.engine`).

Imported only where Ray Data LLM is (the job's driver and the engine actors): it subclasses Ray Data
LLM's own UDF. The name keeps ``vLLMEngineStage`` in it, as Ray's task names and the benches expect.
"""

from __future__ import annotations

from typing import Any

import ray

from airflow_provider_raybatch.pipeline import engine

# In a replica, this module is imported when Ray unpickles the UDF class, before Ray Data LLM's stage
# module imports torch: the earliest point to let the forkserver start its imports (not in the driver).
_IN_A_WORKER = ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
if _IN_A_WORKER and engine.forkserver_enabled():
    engine.start_forkserver()

from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF  # noqa: E402


class RaybatchvLLMEngineStageUDF(vLLMEngineStageUDF):
    """Builds the engine as Ray Data LLM does, its EngineCore from the forkserver unless switched off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: Ray Data LLM's UDF arguments.
        if engine.forkserver_enabled():
            engine.start_forkserver()
            engine.patch_vllm_process_context()
        super().__init__(*args, **kwargs)
