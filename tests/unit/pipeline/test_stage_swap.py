"""pipeline/generate/stage_swap.py: our UDFs in Ray Data LLM's stages, and the fixed engine pool."""

from __future__ import annotations

import sys
import types
from typing import NoReturn

import pytest

from airflow_provider_raybatch.pipeline.generate import engine, stage_swap
from airflow_provider_raybatch.pipeline.generate.stage_swap import StageSwap


@pytest.mark.parametrize(("given", "pool"), [(1, (1, 1)), (2, (2, 2)), ((1, 4), (1, 4)), ([2, 3], (2, 3))])
def test_an_int_concurrency_is_a_fixed_pool(given: int | tuple[int, int], pool: tuple[int, int]) -> None:
    assert stage_swap.fixed_pool(given) == pool  # type: ignore[arg-type]


def _not_rebuilt(stages: list) -> NoReturn:
    raise AssertionError(f"a new processor was built from {stages}: no stage was left out")


def test_a_processor_without_an_engine_stage_is_left_alone() -> None:
    processor = object()
    assert stage_swap.use_our_stages(processor, StageSwap(staging={}), _not_rebuilt) is processor


@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_our_udf_replaces_ray_s_with_the_forkserver_on_or_off(
    forkserver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switch turns the forkserver off, not our UDF (which also serves an OpenAI line's n choices)."""

    class RayUDF:  # stands in for Ray Data LLM's vLLMEngineStageUDF (no Ray in the unit-test env)
        pass

    class OurUDF(RayUDF):
        RAY_UDF = RayUDF

    class vLLMEngineStage:  # noqa: N801 - Ray Data LLM's, which its processor names its stage after
        fn = RayUDF

    actor_module = types.ModuleType("airflow_provider_raybatch.pipeline.generate.engine_actor")
    actor_module.RaybatchvLLMEngineStageUDF = OurUDF  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, actor_module.__name__, actor_module)
    monkeypatch.setenv(engine.FORKSERVER_ENV, forkserver)
    stage, other = vLLMEngineStage(), types.SimpleNamespace(fn=RayUDF)
    stage.fn_constructor_kwargs = {"model": "m"}
    stage.map_batches_kwargs = {"concurrency": (1, 1)}
    stages = {"vLLMEngineStage": stage, "TokenizeStage": other}  # as Ray Data LLM's processor names them
    processor = types.SimpleNamespace(stages=stages)
    staging = {"staging_uri": "/out/_staging/k", "spec": "the spec"}
    assert stage_swap.use_our_stages(processor, StageSwap(staging, "/mnt/compile"), _not_rebuilt) is processor
    assert stage.fn is OurUDF and other.fn is RayUDF
    # The replica gets what it needs to stage its batches and keep its kernels, beside Ray's arguments.
    assert stage.fn_constructor_kwargs == {
        "model": "m",
        stage_swap.STAGING_KWARG: staging,
        stage_swap.COMPILE_CACHE_KWARG: "/mnt/compile",
    }
    # A copy the driver fetched: the replica is told where its cache is, to check it on its node (as
    # are the stages that load the tokenizer, tests/security/test_model_copy_in_stages.py).
    checked = types.ModuleType("airflow_provider_raybatch.pipeline.generate.checked_stages")
    checked.CHECKED, checked.MODEL_COPY_KWARG = {}, stage_swap.MODEL_COPY_KWARG  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, checked.__name__, checked)
    stage.fn = RayUDF  # a processor built afresh
    stage_swap.use_our_stages(
        processor, StageSwap(staging, "/mnt/compile", model_copy_root="/mnt/models"), _not_rebuilt
    )
    assert stage.fn_constructor_kwargs[stage_swap.MODEL_COPY_KWARG] == "/mnt/models"
    # Ray Data restarts a dead replica forever unless told otherwise (map_batches' ray_remote_args).
    assert stage.map_batches_kwargs == {"concurrency": (1, 1), "max_restarts": engine.ENGINE_MAX_RESTARTS}
