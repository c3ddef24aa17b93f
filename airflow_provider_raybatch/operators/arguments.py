"""An operator's arguments as a DAG author writes them: misspelled names, and which values are literal.

Airflow refuses an unknown argument with "Invalid arguments were passed", naming no likely spelling;
this names it. A literal value (no template, no XCom) can be checked as the DAG is parsed.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

import jinja2
from airflow.sdk import BaseOperator

from airflow_provider_raybatch.exceptions import BatchSpecError
from airflow_provider_raybatch.operators.ray_data_llm_settings import RAY_DATA_LLM_SETTINGS
from airflow_provider_raybatch.specs import VLLM_SAMPLING_PARAMS, did_you_mean

#: vLLM engine arguments a notebook passes where this operator takes them in ``engine_kwargs`` (the
#: common ones: the job's driver checks every key of engine_kwargs against the cluster's vLLM).
_ENGINE_ARGUMENTS = frozenset({
    "block_size", "cpu_offload_gb", "distributed_executor_backend", "dtype", "enable_chunked_prefill",
    "enable_lora", "enable_prefix_caching", "enforce_eager", "gpu_memory_utilization",
    "kv_cache_dtype", "kv_cache_memory_bytes", "limit_mm_per_prompt", "max_lora_rank", "max_loras",
    "max_model_len", "max_num_batched_tokens", "max_num_seqs", "pipeline_parallel_size",
    "quantization", "revision", "seed", "swap_space", "tensor_parallel_size", "tokenizer",
    "tokenizer_mode", "trust_remote_code",
})  # fmt: skip

#: BaseOperator's own arguments, and the flag Airflow adds when it checks a mapped task's arguments.
_BASE_ARGUMENTS = frozenset(inspect.signature(BaseOperator.__init__).parameters) - {"self", "kwargs"} | {
    "_airflow_mapped_validation_only"
}
#: Jinja's markers, as Airflow's template environment uses them.
_TEMPLATE_MARKERS = ("{{", "{%")


def refuse_unknown(operator: str, given: dict[str, Any], init: Callable[..., None]) -> None:  # Any: values.
    """Raise TypeError naming each argument of ``given`` that neither ``init`` nor BaseOperator takes,
    with the likeliest spelling.

    :param given: the arguments left for BaseOperator (``**kwargs`` of ``init``).
    """
    unknown = sorted(set(given) - _BASE_ARGUMENTS)
    if not unknown:
        return
    known = _BASE_ARGUMENTS | set(inspect.signature(init).parameters) - {"self", "kwargs"}
    named = ", ".join(f"{name!r}{_hint(name, known)}" for name in unknown)
    task = f" (task_id: {given['task_id']})" if "task_id" in given else ""
    raise TypeError(f"{operator}{task} got unknown argument{'s' if len(unknown) > 1 else ''} {named}.")


def refuse_functions(operator: str, task_id: str, **named: object) -> None:
    """Raise TypeError for a function passed where its dotted path belongs (``preprocess=clean``): the
    job imports it on the cluster by name, and a notebook passes the function itself."""
    for name, value in named.items():
        if callable(value):
            function = getattr(value, "__name__", "")
            function = function if function.isidentifier() else "my_function"  # not "<lambda>"
            raise TypeError(
                f"{operator} (task_id: {task_id}): {name}={value!r} is a function; pass its dotted path "
                f"as text, e.g. {name}='my_rows.{function}', with the function in a module of its own "
                "beside the DAG file (my_rows.py), which the job ships and imports on the cluster."
            )


def refuse_templates_where_none_render(untemplated: dict[str, Any]) -> None:  # Any: argument values.
    """Raise BatchSpecError for a Jinja template given to a parameter Airflow does not render: it
    would reach the job as its text."""
    for name, value in untemplated.items():
        if isinstance(value, str) and not is_literal(value):
            raise BatchSpecError(
                f"{name}={value!r}: {name} is not templated, so Airflow never renders this; write the "
                "value itself (docs/parameters.md lists the templated parameters)."
            )


def first_unparsable_template(fields: dict[str, Any]) -> str | None:  # Any: argument values.
    """The name of the first of ``fields`` whose text Jinja cannot parse, or None."""
    environment = jinja2.Environment()
    for name, value in fields.items():
        if isinstance(value, str):
            try:
                environment.parse(value)
            except jinja2.TemplateSyntaxError:
                return name
    return None


def _hint(name: str, known: AbstractSet[str]) -> str:
    """Where an unknown argument ``name`` goes: a Ray Data LLM setting's place here, a vLLM engine or
    sampling argument's parameter, else its likely spelling."""
    for setting in RAY_DATA_LLM_SETTINGS:
        if name in setting.name.split(", "):
            here = setting.ours.rstrip(".")
            return f" (a Ray Data LLM setting, of {setting.where}; here: {here})".replace("`", "")
    if name in _ENGINE_ARGUMENTS:
        return f" (a vLLM engine argument: pass it in engine_kwargs={{{name!r}: ...}})"
    if name in VLLM_SAMPLING_PARAMS:
        return f" (a vLLM sampling parameter: pass it in sampling_params={{{name!r}: ...}})"
    close = difflib.get_close_matches(name, sorted(known | _ENGINE_ARGUMENTS | VLLM_SAMPLING_PARAMS), n=1)
    if close and close[0] not in known:
        where = "engine_kwargs" if close[0] in _ENGINE_ARGUMENTS else "sampling_params"
        return f" (did you mean {where}={{{close[0]!r}: ...}}?)"
    return did_you_mean(name, known)


def is_literal(value: object) -> bool:
    """Whether ``value`` is plain data with no template in it: what a run would see as written."""
    if isinstance(value, str):
        return not any(marker in value for marker in _TEMPLATE_MARKERS)
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, dict):
        return all(isinstance(key, str) and is_literal(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return all(is_literal(item) for item in value)
    return False  # an XComArg, a Param, an Asset: known only when the task runs
