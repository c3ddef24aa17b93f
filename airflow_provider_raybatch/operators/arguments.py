"""An operator's arguments as a DAG author writes them: misspelled names, and which values are literal.

Airflow refuses an unknown argument with "Invalid arguments were passed", naming no likely spelling,
and a missing required one with "missing keyword argument 'model'", naming neither the task nor the
argument given in its place; these name them. A literal value (no template, no XCom) can be checked
as the DAG is parsed.
"""

from __future__ import annotations

import difflib
import inspect
import re
import reprlib
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

import jinja2
from airflow.sdk import BaseOperator
from airflow.sdk.bases.operator import BaseOperatorMeta

from airflow_provider_raybatch.operators.ray_data_llm_settings import RAY_DATA_LLM_SETTINGS
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_types import Kwargs
from airflow_provider_raybatch.shared.specs import VLLM_SAMPLING_PARAMS, did_you_mean

#: vLLM engine arguments a notebook passes where this operator takes them in ``engine_kwargs`` (the
#: common ones: the job's driver checks every key of engine_kwargs against the cluster's vLLM); a key
#: of engine_kwargs one letter off one of them is warned of (likely_mistakes.py).
ENGINE_ARGUMENTS = frozenset(
    """
    block_size cpu_offload_gb distributed_executor_backend dtype enable_chunked_prefill enable_lora
    enable_prefix_caching enforce_eager gpu_memory_utilization kv_cache_dtype kv_cache_memory_bytes
    limit_mm_per_prompt max_lora_rank max_loras max_model_len max_num_batched_tokens max_num_seqs
    pipeline_parallel_size quantization revision seed swap_space tensor_parallel_size tokenizer tokenizer_mode
    trust_remote_code
    """.split()
)

#: BaseOperator's own arguments, and the flag Airflow adds when it checks a mapped task's arguments.
_BASE_ARGUMENTS = frozenset(inspect.signature(BaseOperator.__init__).parameters) - {"self", "kwargs"} | {
    "_airflow_mapped_validation_only"
}
#: Jinja's markers, as Airflow's template environment uses them.
_TEMPLATE_MARKERS = ("{{", "{%")
#: What Airflow raises for required arguments missing once default_args are merged (its metaclass's
#: ``_apply_defaults``; so worded since Airflow 2). Worded otherwise, it is left as it is.
_AIRFLOW_MISSING = re.compile(r"missing keyword arguments? ('\w+'(?:, '\w+')*)")
#: How much less like an unknown argument a missing one may read than the nearest known name and still
#: be taken as what it meant: the argument is missing, so a near name given beside it most likely is it
#: ('input_path' reads more like 'input_asset', but 'input_uri' is the one left out).
_MISSING_TOLERANCE = 0.15
_VALUE = reprlib.Repr()
_VALUE.maxstring = _VALUE.maxother = 60


class NamesMissingArguments(BaseOperatorMeta):
    """An operator's metaclass whose missing required argument is named with the task and, where an
    unknown argument given reads like it (Ray Data LLM's name, a typo), with that argument.

    Airflow checks required arguments in the wrapper its metaclass puts around ``__init__``, after
    merging the DAG's and the task group's default_args, so only that check knows whether one is
    missing: it runs as it is, and what it raises is reworded here.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:  # Any: operator arguments; the operator.
        init = cls.__init__  # type: ignore[misc]  # a class's __init__, read from the class: sound here
        try:
            return super().__call__(*args, **kwargs)
        except TypeError as err:
            missing = _missing_named_by(err, init, kwargs)
            if not missing:
                raise
            # Airflow's words say less than this and would only repeat it.
            raise TypeError(missing_message(cls.__name__, kwargs, missing, init)) from None


def missing_message(
    operator: str,
    given: Kwargs,
    missing: list[str],
    init: Callable[..., None],
) -> str:
    """The error for required arguments ``missing`` from ``given``: each with the unknown argument of
    ``given`` that reads like it, then the other unknown ones with their hints.

    :param given: the arguments the operator was called with.
    """
    known = _known(init)
    unknown = sorted(name for name in set(given) - known if not name.startswith("_airflow"))
    meant = {}
    for name in unknown:
        target = _missing_meant(name, missing, known)
        if target is not None and target not in meant:
            meant[target] = name
    named = []
    for name in missing:
        if name in meant:
            value = _VALUE.repr(given[meant[name]])
            named.append(
                f"{name!r} (you passed {meant[name]}={value}: in this operator it is {name}={value})"
            )
        else:
            named.append(repr(name))
    task = f" (task_id: {given['task_id']})" if "task_id" in given else ""
    plural = "s" if len(missing) > 1 else ""
    message = f"{operator}{task}: missing required argument{plural} {', '.join(named)}."
    others = [name for name in unknown if name not in meant.values()]
    if others:
        message += " Also unknown: " + ", ".join(f"{name!r}{_hint(name, known)}" for name in others) + "."
    return message


def _missing_named_by(
    err: TypeError,
    init: Callable[..., None],
    given: Kwargs,
) -> list[str]:
    """The required arguments of ``init`` that Airflow's ``err`` says are missing; empty when ``err``
    is another TypeError."""
    match = _AIRFLOW_MISSING.fullmatch(str(err))
    if match is None:
        return []
    names = re.findall(r"'(\w+)'", match.group(1))
    parameters = inspect.signature(init).parameters
    required = {name for name, parameter in parameters.items() if parameter.default is parameter.empty}
    if not set(names) <= required or set(names) & set(given):
        return []
    return names


def _missing_meant(name: str, missing: list[str], known: AbstractSet[str]) -> str | None:
    """The missing argument that an unknown argument ``name`` most likely is, or None."""
    for setting in RAY_DATA_LLM_SETTINGS:
        if name in setting.name.split(", "):
            here = re.match(r"`(\w+)`", setting.ours)  # the parameter its row names first, if any
            return here.group(1) if here and here.group(1) in missing else None
    ratios = {known_name: difflib.SequenceMatcher(None, name, known_name).ratio() for known_name in known}
    best = max(ratios.values(), default=0.0)
    likely = [m for m in missing if ratios.get(m, 0.0) >= max(0.6, best - _MISSING_TOLERANCE)]
    return max(likely, key=lambda m: ratios[m]) if likely else None


def _known(init: Callable[..., None]) -> frozenset[str]:
    """The arguments an operator whose ``__init__`` is ``init`` takes, BaseOperator's included."""
    return _BASE_ARGUMENTS | set(inspect.signature(init).parameters) - {"self", "kwargs"}


def refuse_unknown(operator: str, given: Kwargs, init: Callable[..., None]) -> None:
    """Raise TypeError naming each argument of ``given`` that neither ``init`` nor BaseOperator takes,
    with the likeliest spelling.

    :param given: the arguments given (or those left for BaseOperator: ``**kwargs`` of ``init``).
    """
    known = _known(init)
    unknown = sorted(set(given) - known)
    if not unknown:
        return
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


def refuse_templates_where_none_render(untemplated: Kwargs) -> None:
    """Raise BatchSpecError for a Jinja template given to a parameter Airflow does not render: it
    would reach the job as its text."""
    for name, value in untemplated.items():
        if isinstance(value, str) and not is_literal(value):
            raise BatchSpecError(
                f"{name}={value!r}: {name} is not templated, so Airflow never renders this; write the "
                "value itself (docs/parameters.md lists the templated parameters)."
            )


def first_unparsable_template(fields: Kwargs) -> str | None:
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
    if name in ENGINE_ARGUMENTS:
        return f" (a vLLM engine argument: pass it in engine_kwargs={{{name!r}: ...}})"
    if name in VLLM_SAMPLING_PARAMS:
        return f" (a vLLM sampling parameter: pass it in sampling_params={{{name!r}: ...}})"
    close = difflib.get_close_matches(name, sorted(known | ENGINE_ARGUMENTS | VLLM_SAMPLING_PARAMS), n=1)
    if close and close[0] not in known:
        where = "engine_kwargs" if close[0] in ENGINE_ARGUMENTS else "sampling_params"
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
