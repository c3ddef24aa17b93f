"""The vLLM stage's UDF: a faster start (see :mod:`~airflow_provider_raybatch.pipeline.generate.engine`),
and the choices and embeddings that Ray Data LLM's own UDF leaves out (swapped in by :mod:`.stage_swap`).

Imported only where Ray Data LLM is (the job's driver and the engine actors): it subclasses Ray Data
LLM's own UDF. The name keeps ``vLLMEngineStage`` in it, as Ray's task names and the benches expect.

Ray Data LLM sends one engine request per row and keeps the first choice of its output only
(``vLLMOutputData.from_vllm_engine_output`` reads ``outputs[0]``). A row stays one OpenAI line (staging
and resume count rows by source line), so the replica's engine wrapper is wrapped instead: a request
with ``n`` > 1 also returns its other choices, as the row's ``extra_choices``; and an embeddings line's
``extra_inputs`` go to the engine as requests of their own, their embeddings back as the row's
``extra_embeddings`` (formats: :func:`.openai_batch.choice_record`, :func:`.openai_batch.embedding_record`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.json_types import ArgValue, Kwargs, Row

#: When a replica's process imported this module (Ray unpickling the UDF class): its start-up clock.
_LOADED_AT = time.time()

import asyncio  # noqa: E402 - after the clock above
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

from airflow_provider_raybatch.pipeline.generate import engine, engine_caches, models  # noqa: E402
from airflow_provider_raybatch.pipeline.generate.staged_udf import StagesFinishedRows  # noqa: E402
from airflow_provider_raybatch.pipeline.openai import openai_batch  # noqa: E402
from airflow_provider_raybatch.pipeline.reporting.timings import replica_clock  # noqa: E402


class EngineBuildError(RuntimeError):
    """vLLM's engine failed to build, with the error its EngineCore process died of (its parent's own
    error says only "See root cause above"): a setting the engine refuses, most often."""


# In a replica, this module is imported when Ray unpickles the UDF class, before Ray Data LLM's stage
# module imports torch: the earliest point to let the forkserver start its imports (not in the driver).
_IN_A_WORKER = ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
if _IN_A_WORKER and engine.forkserver_enabled():
    engine.start_forkserver()

from ray.llm._internal.batch.stages.vllm_engine_stage import (  # noqa: E402
    _convert_logprob_dict,
    vLLMEngineStageUDF,
    vLLMOutputData,
)

if TYPE_CHECKING:
    from vllm import PoolingParams, PoolingRequestOutput, RequestOutput, SamplingParams

#: Row fields that hold the first input's tokens: a request for another input must not carry them.
_PROMPT_TOKEN_FIELDS = ("tokenized_prompt", "prompt_token_ids")


class RaybatchvLLMEngineStageUDF(StagesFinishedRows, vLLMEngineStageUDF):
    """Builds the engine as Ray Data LLM does (its EngineCore from the forkserver, unless switched off),
    has it return every choice and every input's embedding, and stages each row where it finished.

    Staging in the replica: each row the engine finishes joins the replica's buffer at once, and the
    buffer is staged every half batch and whenever a batch ends (:mod:`.replica_staging`), so a job
    killed a moment later loses at most one batch of finished rows per replica (staged a batch at a
    time, it lost every finished row of the batches in flight; handed on to a write task, they waited
    1-3 s more in Ray Data's queues). A batch whose replica dies is retried whole; commit keeps the
    first staged copy of each row (:func:`.commit._drop_repeated_rows`).
    """

    #: The Ray Data LLM UDF this one takes the place of (stage_swap.swap_stages).
    RAY_UDF = vLLMEngineStageUDF
    #: The folders its engine loads compiled code from, checked before the engine was built; a warm
    #: pool's replica checks them again at each attach (:mod:`.pool_replica`).
    cache_folders: tuple[engine_caches.CacheFolder, ...] = ()

    def __init__(
        self,
        *args: ArgValue,
        raybatch_staging: Kwargs | None,
        raybatch_compile_cache_dir: str | None = None,
        raybatch_model_copy_root: str | None = None,
        **kwargs: ArgValue,
    ) -> None:  # Ray Data LLM's UDF arguments; ours come from stage_swap.swap_stages.
        """:param raybatch_staging: where to stage finished rows; None in a warm pool's replica
        (:mod:`.pool_replica`), which returns its rows to the job's stage instead."""
        init_started_at = time.time()
        # Before the engine starts: its EngineCore gets this process's environment (spawned or forked),
        # and nothing may be loaded from a cache folder another local user could have planted.
        self.cache_folders = engine_caches.checked_cache_folders(raybatch_compile_cache_dir, os.environ)
        os.environ.update(engine_caches.environment(self.cache_folders))
        engine_caches.turn_off_precompiled_headers()
        if raybatch_model_copy_root is not None:  # a copy the driver fetched, maybe not onto this node
            models.check_copy_in_replica(str(kwargs.get("model")), raybatch_model_copy_root)
        if engine.forkserver_enabled():
            engine.start_forkserver()
            engine.patch_vllm_process_context()
            engine.patch_vllm_model_inspection()
        with engine.engine_core_errors() as engine_core_error:
            try:
                super().__init__(*args, **kwargs)
            except Exception as err:
                cause = engine_core_error()
                if cause is None:
                    raise
                raise EngineBuildError(
                    f"{cause.rstrip('.')} (vLLM's EngineCore, building the engine)."
                ) from err
        # An instance attribute: Ray's _generate_with_error_handling calls self.llm.generate_async(row),
        # and keeps doing its error handling around ours.
        self.llm.generate_async = functools.partial(generate_with_extras, self.llm)
        if raybatch_staging is not None:
            clock = replica_clock(_LOADED_AT, init_started_at, engine_ready_at=time.time())
            self._start_staging(raybatch_staging, replica=clock)

    def normalize_engine_kwargs(self, engine_kwargs: Kwargs) -> Kwargs:
        """Ray Data LLM's normalization, then raw vLLM's batch sizes where unset (see :mod:`.engine`)."""
        return engine.with_llm_class_batch_defaults(super().normalize_engine_kwargs(engine_kwargs))


async def generate_with_extras(llm: Any, row: dict[str, Any]) -> tuple[Any, dict[str, Any], float]:
    """Ray Data LLM's ``vLLMEngineWrapper.generate_async`` (``llm``), plus the row's extra columns.

    Returns (the row's engine request, its output fields, seconds in the engine), as Ray's does.
    """
    if isinstance(row.get("sampling_params"), str):  # JSON text on the way here (row_steps.engine_request)
        row["sampling_params"] = json.loads(row["sampling_params"])
    extra_inputs = row.get(openai_batch.EXTRA_INPUTS)
    extra_inputs = json.loads(extra_inputs) if isinstance(extra_inputs, str) else []  # None: one input
    # Copied before the first request is prepared: _prepare_llm_request pops the row's prompt fields.
    extra_rows = [_row_for_input(row, text) for text in extra_inputs]
    requests = [await llm._prepare_llm_request(row)]
    requests += [await llm._prepare_llm_request(extra) for extra in extra_rows]
    _final_output_only(requests[0].params)
    started = time.perf_counter()
    outputs = await asyncio.gather(*(_generate(llm, request) for request in requests))
    time_taken = time.perf_counter() - started
    output = vLLMOutputData.from_vllm_engine_output(outputs[0]).model_dump()
    output[openai_batch.EXTRA_CHOICES] = _extra_choices(outputs[0])
    output[openai_batch.EXTRA_EMBEDDINGS] = _extra_embeddings(outputs[1:])
    output[openai_batch.FINISH_REASON] = _finish_reason(outputs[0])
    return requests[0], output, time_taken


def _final_output_only(params: SamplingParams | PoolingParams) -> None:
    """Have the engine return a generation's output once, when it ends, as ``LLM.generate`` does.

    Ray Data LLM reads the final output only, but asks for the default, cumulative stream: one
    output per step, each a copy of the text and tokens so far, and a wake-up of the row's task.
    That is per-row Python in the one process that feeds the engine. And with ``n`` > 1, a streamed
    last output holds only the choices that changed last; final-only, it holds all n.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if isinstance(params, SamplingParams):
        params.output_kind = RequestOutputKind.FINAL_ONLY


def _row_for_input(row: Row, text: str) -> Row:
    """The row as a request for another input: that text as the prompt, which the engine tokenizes."""
    other = {key: value for key, value in row.items() if key not in _PROMPT_TOKEN_FIELDS}
    return {**other, "prompt": text}


async def _generate(llm: Any, request: Any) -> Any:  # Any: vLLMEngineWrapper, its request and output.
    async with llm.semaphore:  # as Ray's generate_async: a bound on the requests in the engine
        return await llm._generate_async(request)


def _extra_choices(output: RequestOutput | PoolingRequestOutput) -> str | None:
    """The choices after the first, as JSON; None where there are none."""
    import vllm

    if not isinstance(output, vllm.outputs.RequestOutput) or len(output.outputs) < 2:
        return None
    choices = []
    for completion in output.outputs[1:]:
        logprobs = None
        if completion.logprobs is not None:
            steps = [_convert_logprob_dict(step) for step in completion.logprobs]  # as Ray does for the first
            logprobs = openai_batch.token_logprobs(steps, completion.token_ids)
        record = openai_batch.choice_record(
            completion.text, len(completion.token_ids), logprobs, completion.finish_reason
        )
        choices.append(record)
    return json.dumps(choices)


def _finish_reason(output: RequestOutput | PoolingRequestOutput) -> str | None:
    """Why the first choice ended, as vLLM says ("stop", "length", ...); None for embeddings."""
    completions = getattr(output, "outputs", None)
    return completions[0].finish_reason if isinstance(completions, list) and completions else None


def _extra_embeddings(outputs: list[PoolingRequestOutput]) -> str | None:
    """The embeddings of the inputs after the first, as JSON; None where there are none."""
    if not outputs:
        return None
    entries = []
    for output in outputs:
        data = vLLMOutputData.from_vllm_engine_output(output)
        entries.append(openai_batch.embedding_record(data.embeddings.tolist(), data.num_input_tokens))
    return json.dumps(entries)
