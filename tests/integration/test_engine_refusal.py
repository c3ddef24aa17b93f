"""An engine setting that vLLM refuses only while it builds: the replica's error says vLLM's reason.

Why: ``engine_kwargs={"kv_cache_memory_bytes": 4096}`` failed the task after two
builds with vLLM's parent error only, ``Engine core initialization failed. See root cause above``; the
reason (``No available memory for the cache blocks``) was in the EngineCore's own log, which the task
never shows. Here the real replica UDF builds the real vLLM CPU engine on the tiny model, its EngineCore
forked from our forkserver, as a warm pool's replica and a job's engine actor do. No Ray cluster: the
constructor is what fails, and the pool's handling of that error is tests/unit/pipeline/test_engine_pool.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import CPU_ENGINE_KWARGS
from tests.unit.pipeline.ray_env import run_in_ray_env

_BUILD = """
import json
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMTaskType
from airflow_provider_raybatch.pipeline.generate import engine_actor
try:
    engine_actor.RaybatchvLLMEngineStageUDF(
        data_column="__data", expected_input_keys=[], raybatch_staging=None, model=MODEL,
        engine_kwargs=json.loads(ENGINE_KWARGS), task_type=vLLMTaskType.GENERATE, max_pending_requests=8,
        batch_size=8, max_concurrent_batches=1)
except Exception as err:
    print(json.dumps({"type": type(err).__name__, "error": str(err)}))
else:
    print(json.dumps({"type": None}))
"""


def test_a_setting_vllm_refuses_while_building_names_vllms_reason(tiny_model: Path) -> None:
    refused = {**CPU_ENGINE_KWARGS, "kv_cache_memory_bytes": 4096}
    code = f"MODEL = {str(tiny_model)!r}\nENGINE_KWARGS = {json.dumps(refused)!r}\n{_BUILD}"
    report = run_in_ray_env(code)
    assert report["type"] == "EngineBuildError", report
    assert report["error"].startswith("ValueError: No available memory for the cache blocks."), report
    assert report["error"].endswith("(vLLM's EngineCore, building the engine)."), report
