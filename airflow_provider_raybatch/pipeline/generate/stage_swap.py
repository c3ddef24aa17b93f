"""Our UDFs in Ray Data LLM's stages: the one place where the processor Ray builds is changed.

Ray Data LLM's ``build_processor`` builds its stages and their settings (resources, the engine's
keywords, placement); the driver changes them in place and runs that processor, or, where the warm
pool leaves stages out, one built from the rest with Ray's public constructor,
``Processor(config, stages, ...)`` (:func:`use_our_stages`, :func:`.processor.build_llm_processor`).
Each stage is addressed by the name Ray's processor gives it (``Processor.list_stage_names()``: its
stage class's name, in Ray 2.57 as in 2.60). What changes:

* **Fixed pool.** Ray Data LLM turns an int ``concurrency=n`` of the engine stage into an autoscaling
  pool of 1..n replicas (``get_concurrency(autoscaling_enabled=True)``): the second replica starts
  only once the first is busy, ~57 s late on 2 x H200. A batch job wants all of them from the start,
  so an int becomes ``(n, n)`` (:func:`fixed_pool`); a ``(min, max)`` tuple stays an autoscaling pool.
* **Our engine UDF, forkserver on or off.** The vLLM stage runs our UDF (:mod:`.engine_actor`)
  either way; ``RAYBATCH_ENGINE_FORKSERVER`` decides the forkserver only (:mod:`.engine`). The UDF
  also returns what Ray Data LLM's drops (an OpenAI line's choices after the first, the embeddings
  of its inputs after the first) and stages each row as it finishes.
* **Our chat-template UDF**, which renders row by row (:mod:`..prompt.chat_template`), and, for a
  model copy the driver fetched, the stages that load from it checking it first (:mod:`.checked_stages`).
* **Or a warm pool** (``keep_warm_seconds``): the engine stage sends its rows to the pool's replicas
  (:mod:`.pooled_stage`, :mod:`.engine_pool`), which may also render the prompts.

Ray's stage modules import vLLM and torch at their top, so ours (which subclass Ray's UDFs) are
imported in the functions that swap them in, while the driver holds those libraries back
(:func:`.processor.engine_libraries_held_back`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.generate import engine
from airflow_provider_raybatch.pipeline.generate.engine_pool import (
    RESOURCE_KWARGS,
    EnginePool,
    live_replica_names,
    plan_pool,
    ray_is_up,
    replica_needs,
)
from airflow_provider_raybatch.pipeline.generate.models import MODEL_COPY_KWARG
from airflow_provider_raybatch.shared.json_types import Kwargs, RuntimeEnv

if TYPE_CHECKING:
    from ray.data.llm import Processor
    from ray.llm._internal.batch.stages.base import StatefulStage

#: The names Ray Data LLM's processor gives the stages we change (``Processor.list_stage_names()``).
ENGINE_STAGE = "vLLMEngineStage"
CHAT_TEMPLATE_STAGE = "ChatTemplateStage"
TOKENIZE_STAGE = "TokenizeStage"

#: Our UDF's constructor keyword: what its replica needs to stage its finished rows itself.
STAGING_KWARG = "raybatch_staging"
#: Our UDF's constructor keyword: the spec's ``compile_cache_dir``.
COMPILE_CACHE_KWARG = "raybatch_compile_cache_dir"
#: The pooled stage's constructor keyword: the job's :class:`.engine_pool.EnginePool`.
POOL_KWARG = "raybatch_pool"
#: The pooled stage's constructor keyword: whether the pool's replicas render this job's prompts.
RENDER_IN_POOL_KWARG = "raybatch_render_in_pool"


def fixed_pool(concurrency: int | tuple[int, int]) -> tuple[int, int]:
    """An int n -> (n, n): n replicas from the start; (min, max) as given."""
    if isinstance(concurrency, int):
        return (concurrency, concurrency)
    return (concurrency[0], concurrency[1])


@dataclass(frozen=True)
class WarmPool:
    """A job's engines on a warm pool (``keep_warm_seconds``) instead of replicas of its own.

    :param replicas: the pool's replicas for this job.
    :param keep_warm_seconds: how long a replica stays up with no job on it.
    :param job_runtime_env: the job's runtime env, of which the replicas keep our code and settings
        (:func:`.engine_pool.plan_pool`).
    :param render_prompts_in_pool: the replicas apply the chat template and the engine tokenizes, so
        the job starts no chat-template and tokenize actors: each would start a process, import
        transformers and load the tokenizer (seconds per job on a GPU host, the bulk of a warm job's
        wait for its first row), which the warm replica already holds. False (a batch with images):
        the job keeps Ray Data LLM's stages, ours for the chat template. Either way the pool is the
        model's and the engine settings', not the chat template's: a job that renders its own
        prompts, one that does not and a completions job (no chat template), on the same model and
        engine settings, share one pool (two would hold two engines of one model on the GPU); the
        replicas render each job's rows with that job's chat template.
    """

    replicas: int
    keep_warm_seconds: float
    job_runtime_env: RuntimeEnv
    render_prompts_in_pool: bool = True


@dataclass(frozen=True)
class StageSwap:
    """What our stages need from the job.

    :param staging: the keywords of :class:`.parts.PartWriter` plus ``spec``: the replica then
        stages the rows it finishes as they finish (:mod:`.replica_staging`).
    :param compile_cache_dir: where the replica keeps compiled graphs and kernels (:mod:`.engine_caches`).
    :param model_copy_root: the ``model_cache_dir`` of a model copy the driver fetched, which the replica
        checks on its node before its engine loads it (:func:`.models.check_copy_in_replica`).
    :param pool: the warm pool the engine stage runs on; None: the job's own engine replicas.
    """

    staging: Kwargs
    compile_cache_dir: str | None = None
    model_copy_root: str | None = None
    pool: WarmPool | None = None


def swap_stages(stages: Mapping[str, StatefulStage], swap: StageSwap) -> list[StatefulStage]:
    """Ray Data LLM's stages, by the names its processor gives them, with our UDFs: the stages of the
    processor the job runs, in Ray's order."""
    ours = dict(stages)
    chat_template = ours.get(CHAT_TEMPLATE_STAGE)
    if chat_template is not None:
        _use_our_chat_template_udf(chat_template)
    if swap.model_copy_root is not None:
        _check_model_copy_in_stages(ours.values(), swap.model_copy_root)
    if ENGINE_STAGE in ours:
        _use_our_engine_udf(ours[ENGINE_STAGE], swap)
    if swap.pool is not None:
        _use_engine_pool(ours, swap, swap.pool)
    return list(ours.values())


def use_our_stages(
    processor: Processor, swap: StageSwap, rebuilt: Callable[[list[StatefulStage]], Processor]
) -> Processor:
    """The processor Ray Data LLM built, with our UDFs (:func:`swap_stages`): the same processor, whose
    stages were changed in place, unless the warm pool left stages out (its replicas render the
    prompts); then ``rebuilt(stages)``, made from the stages left by Ray's public ``Processor``."""
    stages = getattr(processor, "stages", {})
    ours = swap_stages(stages, swap)
    if len(ours) == len(stages) and all(mine is ray for mine, ray in zip(ours, stages.values(), strict=True)):
        return processor
    return rebuilt(ours)


def pool_of(processor: Processor) -> EnginePool | None:
    """The warm pool the processor's engine stage runs on (:class:`WarmPool`); None: its own engines."""
    stage = getattr(processor, "stages", {}).get(ENGINE_STAGE)
    return None if stage is None else stage.fn_constructor_kwargs.get(POOL_KWARG)


def own_replica_needs(processor: Processor) -> dict[str, float]:
    """What one of the job's own engine replicas reserves (its engine stage's resources), as
    ``ray.available_resources()`` names them; {} where the stage places them itself (tensor or
    pipeline parallel engines, through placement groups)."""
    stage = getattr(processor, "stages", {}).get(ENGINE_STAGE)
    if stage is None or "ray_remote_args_fn" in stage.map_batches_kwargs:
        return {}
    kwargs = stage.map_batches_kwargs
    return replica_needs({key: kwargs[key] for key in RESOURCE_KWARGS if kwargs.get(key)})


def _use_our_engine_udf(stage: StatefulStage, swap: StageSwap) -> None:
    """The vLLM stage runs our UDF (:mod:`.engine_actor`), restarted at most
    :func:`.engine.engine_max_restarts` times."""
    from airflow_provider_raybatch.pipeline.generate.engine_actor import RaybatchvLLMEngineStageUDF

    stage.map_batches_kwargs["max_restarts"] = engine.engine_max_restarts()  # the dict itself: no validator
    if stage.fn is not RaybatchvLLMEngineStageUDF.RAY_UDF:
        return
    # Not `stage.fn = ...`: the stage validates assignments, and its validator, run twice, loses the
    # placement group it popped the first time (the replica then asks for a GPU on a CPU cluster).
    stage.__dict__["fn"] = RaybatchvLLMEngineStageUDF
    stage.fn_constructor_kwargs[COMPILE_CACHE_KWARG] = swap.compile_cache_dir
    if swap.model_copy_root is not None:
        stage.fn_constructor_kwargs[MODEL_COPY_KWARG] = swap.model_copy_root
    stage.fn_constructor_kwargs[STAGING_KWARG] = swap.staging  # the dict itself: no validator runs


def _use_engine_pool(stages: dict[str, StatefulStage], swap: StageSwap, pool: WarmPool) -> None:
    """Put the vLLM stage on a warm pool (:mod:`.engine_pool`), and leave out the stages whose work
    the pool's replicas do (:attr:`WarmPool.render_prompts_in_pool`).

    The stage then runs :class:`.pooled_stage.RaybatchPooledEngineStageUDF`, which reserves no
    resources and sends its rows to the pool's replicas; the resources the stage would have reserved
    go to the replicas, with its engine keywords.
    """
    from airflow_provider_raybatch.pipeline.generate.pooled_stage import RaybatchPooledEngineStageUDF

    chat_template_stage = stages.get(CHAT_TEMPLATE_STAGE)
    chat_template = None if chat_template_stage is None else dict(chat_template_stage.fn_constructor_kwargs)
    if pool.render_prompts_in_pool:
        stages.pop(CHAT_TEMPLATE_STAGE, None)
        stages.pop(TOKENIZE_STAGE, None)
    stage = stages[ENGINE_STAGE]
    # Ray Data LLM's keywords for its UDF, without ours (_use_our_engine_udf added them).
    engine_kwargs = {
        key: value for key, value in stage.fn_constructor_kwargs.items() if not key.startswith("raybatch_")
    }
    planned = plan_pool(
        engine_kwargs,
        stage.map_batches_kwargs,
        pool.replicas,
        pool.keep_warm_seconds,
        swap.compile_cache_dir,
        pool.job_runtime_env,
        chat_template,
        swap.model_copy_root,
    )
    if ray_is_up():  # in a job: take the pool's live replicas first (engine_pool.EnginePool.preferring_live)
        planned = planned.preferring_live(live_replica_names())
    for name in RESOURCE_KWARGS:
        stage.map_batches_kwargs.pop(name, None)  # the dict itself: no validator runs
    stage.map_batches_kwargs["num_cpus"] = 0  # it waits on the pool; the pool's replicas hold the resources
    stage.map_batches_kwargs["max_restarts"] = engine.engine_max_restarts()
    stage.__dict__["fn"] = RaybatchPooledEngineStageUDF  # as in _use_our_engine_udf: no validator run
    stage.fn_constructor_kwargs.clear()
    stage.fn_constructor_kwargs.update(
        {
            "task_type": engine_kwargs.get("task_type"),
            POOL_KWARG: planned,
            STAGING_KWARG: swap.staging,
            RENDER_IN_POOL_KWARG: pool.render_prompts_in_pool and chat_template is not None,
        }
    )


def _use_our_chat_template_udf(stage: StatefulStage) -> None:
    """The chat-template stage runs our UDF, which renders row by row (:mod:`..prompt.chat_template`)."""
    from airflow_provider_raybatch.pipeline.prompt.chat_template import RaybatchChatTemplateUDF

    if stage.fn is RaybatchChatTemplateUDF.__mro__[1]:
        stage.__dict__["fn"] = RaybatchChatTemplateUDF  # as for the engine stage: no validator run


def _check_model_copy_in_stages(stages: Iterable[StatefulStage], model_copy_root: str) -> None:
    """Swap the UDF of each stage that loads from the model's path (chat template, tokenize,
    detokenize) for one that checks the fetched copy first (:mod:`.checked_stages`)."""
    from airflow_provider_raybatch.pipeline.generate.checked_stages import CHECKED

    for stage in stages:
        checked = CHECKED.get(stage.fn)
        if checked is not None:
            stage.__dict__["fn"] = checked  # as for the engine stage: no validator run
            stage.fn_constructor_kwargs[MODEL_COPY_KWARG] = model_copy_root
