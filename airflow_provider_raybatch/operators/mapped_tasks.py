"""A mapped batch task (``RayLLMBatchOperator.partial(...).expand(...)``), checked as the DAG is parsed
and validated, map index by map index, in a DAG's own test.

Airflow builds a mapped task's operators only as each map index runs, so without this a value given
to ``partial`` or listed in ``expand`` was first checked hours after the DAG parsed, and a mistake in
the third of five inputs failed the third task alone. Here ``partial``'s values written as is are
checked as it is called, and each map index whose values the DAG file holds is built as Airflow will
build it (``MappedOperator.unmap``), so it runs the checks a task built alone runs; an error names the
map index and its values. A value mapped over an upstream task's XCom is known only when that task
has run: it waits, as a template does, and :func:`validate_mapped` takes it from the test.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import reprlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
from airflow.sdk.definitions._internal.contextmanager import DagContext
from airflow.sdk.definitions.mappedoperator import MappedOperator, OperatorPartial

from airflow_provider_raybatch.operators import arguments, written_values
from airflow_provider_raybatch.operators.spec_params import SPEC_PARAMETERS
from airflow_provider_raybatch.shared.exceptions import BatchSpecError
from airflow_provider_raybatch.shared.json_types import ArgValue, Kwargs

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: The most map indexes built as the DAG is parsed (0.2 ms each); past it, every listed value is
#: still built once, in the map indexes that pair the lists' n-th values.
MAX_PARSE_TIME_INDEXES = 1_000
_VALUE = reprlib.Repr()
_VALUE.maxstring = _VALUE.maxother = 80


@attrs.define(kw_only=True, repr=False)
class CheckedPartial(OperatorPartial):
    """Airflow's ``partial(...)`` whose ``expand`` / ``expand_kwargs`` build and check each map index
    the DAG file lists."""

    @classmethod
    def of(cls, partial: OperatorPartial) -> CheckedPartial:
        """This class's twin of Airflow's ``partial``, which is marked expanded (it never will be: its
        twin is) so that it does not warn that the task was never mapped."""
        partial._expand_called = True
        return cls(operator_class=partial.operator_class, kwargs=partial.kwargs, params=partial.params)

    def expand(self, **mapped_kwargs: ArgValue) -> MappedOperator:
        _refuse_unknown(self.operator_class, "expand", mapped_kwargs)
        mapped = super().expand(**mapped_kwargs)
        _check_map_indexes(mapped)
        return mapped

    def expand_kwargs(self, kwargs: Any, *, strict: bool = True) -> MappedOperator:  # Any: Airflow's.
        mapped = super().expand_kwargs(kwargs, strict=strict)
        _check_map_indexes(mapped)
        return mapped


def check_partial(operator_class: type[RayLLMBatchOperator], kwargs: Kwargs) -> None:
    """Check what ``operator_class.partial(**kwargs)`` is given, before Airflow takes it: unknown names
    with their likely spelling, then the values written as is (the mapped ones wait)."""
    _refuse_unknown(operator_class, "partial", kwargs)
    task = f"{operator_class.__name__} (task_id: {kwargs.get('task_id')})"
    arguments.refuse_functions(
        operator_class.__name__,
        str(kwargs.get("task_id")),
        preprocess=kwargs.get("preprocess"),
        postprocess=kwargs.get("postprocess"),
    )
    checked = {*SPEC_PARAMETERS, *written_values.FLAGS}
    # The DAG partial() is called in, as Airflow's own partial() finds it.
    dag = kwargs.get("dag") or DagContext.get_current()
    written_values.check_as_written(
        task,
        {name: value for name, value in kwargs.items() if name in checked},
        template_fields=operator_class.template_fields,
        complete=False,
        dag_file=getattr(dag, "fileloc", None),
    )


def validate_mapped(
    task: MappedOperator,
    context: Mapping[str, ArgValue] | None = None,
    expand: Mapping[str, Sequence[ArgValue]] | Sequence[Mapping[str, ArgValue]] | None = None,
) -> list[BatchInferenceSpec]:
    """Each map index of a mapped batch task, built and validated as a run would (its
    :meth:`~RayLLMBatchOperator.validate`): the job specs, in map index order.

    :param context: as for :meth:`~RayLLMBatchOperator.validate`.
    :param expand: the values of what is mapped over an upstream task's XCom, which the DAG file does
        not hold: for ``expand(input_uri=files.output)``, ``{"input_uri": [...]}``; for
        ``expand_kwargs(...)``, the list of dicts.
    :raises BatchSpecError: naming the map index, or a mapped argument whose values are not given.
    """
    if not isinstance(task, MappedOperator) or not hasattr(task.operator_class, "validate"):
        raise TypeError(f"validate_mapped takes a mapped batch task, not {task!r}: use task.validate().")
    specs = []
    for where, mapped_kwargs in _map_indexes(task, expand, every=True):
        with _naming(task, where):
            operator = cast("RayLLMBatchOperator", task.unmap(mapped_kwargs))
            specs.append(operator.validate(context))
    return specs


def _refuse_unknown(operator_class: type[BaseOperator], method: str, given: Mapping[str, ArgValue]) -> None:
    """Raise TypeError for names the operator does not take, with the likely one (Airflow's own error
    names none)."""
    arguments.refuse_unknown(f"{operator_class.__name__}.{method}()", dict(given), operator_class.__init__)


def _check_map_indexes(mapped: MappedOperator) -> None:
    """Build each map index the DAG file lists (up to MAX_PARSE_TIME_INDEXES), as Airflow will build
    it; its checks' errors name the map index, and a warning repeated by every index is said once."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for where, mapped_kwargs in _map_indexes(mapped, None, every=False):
            with _naming(mapped, where):
                mapped.unmap(mapped_kwargs)
    for message in dict.fromkeys(str(warning.message) for warning in said):
        category = next(warning.category for warning in said if str(warning.message) == message)
        warnings.warn(message, category, stacklevel=3)


def _map_indexes(
    mapped: MappedOperator,
    given: Mapping[str, Sequence[ArgValue]] | Sequence[Mapping[str, ArgValue]] | None,
    every: bool,
) -> Iterator[tuple[str, Kwargs]]:
    """(how an error names it, the mapped arguments) of each map index to build.

    :param given: the values of what is mapped over an XCom (validate_mapped's ``expand``).
    :param every: every map index, each XCom's values given (validate); else as the DAG is parsed:
        an XCom stands as itself (its value waits, as a template does), and past
        MAX_PARSE_TIME_INDEXES only the indexes that pair the lists' n-th values.
    """
    value = mapped.expand_input.value
    if not isinstance(value, Mapping) or type(mapped.expand_input).__name__ != "DictOfListsExpandInput":
        yield from _kwargs_indexes(mapped, value, given, every)
        return
    lists: dict[str, list[ArgValue] | None] = {}  # None: an XCom's, not known here
    for name, values in value.items():
        if isinstance(values, Mapping):
            lists[name] = list(values.items())  # Airflow maps a dict as its (key, value) pairs
        elif isinstance(values, Sequence) and not isinstance(values, str):
            lists[name] = list(values)
        elif every and isinstance(given, Mapping) and name in given:
            lists[name] = list(given[name])
        elif every:
            raise BatchSpecError(
                f"{mapped.operator_class.__name__} (task_id: {mapped.task_id}): {name} is mapped over "
                f"{values!r}, known only when it runs: give its values, validate_mapped(task, context, "
                f"expand={{{name!r}: [...]}})."
            )
        else:
            lists[name] = None
    known = {name: values for name, values in lists.items() if values is not None}
    lengths = [len(values) for values in known.values()]
    if every or math.prod(lengths) <= MAX_PARSE_TIME_INDEXES:
        positions: Iterator[tuple[int, ...]] = itertools.product(*(range(length) for length in lengths))
    else:
        positions = (tuple(n % length for length in lengths) for n in range(max(lengths)))
    exact = len(known) == len(lists)
    for position in positions:
        chosen = {name: known[name][at] for name, at in zip(known, position, strict=True)}
        shown = ", ".join(f"{name}={_VALUE.repr(item)}" for name, item in chosen.items())
        if exact:  # Airflow's order: the last argument's values vary fastest
            index = sum(at * math.prod(lengths[i + 1 :]) for i, at in enumerate(position))
            where = f"map index {index}: {shown}"
        else:
            at_each = ", ".join(f"{name}[{at}]" for name, at in zip(known, position, strict=True))
            where = f"{at_each}: {shown}"
        yield where, {name: chosen.get(name, value[name]) for name in value}


def _kwargs_indexes(
    mapped: MappedOperator,
    value: ArgValue,
    given: Mapping[str, Sequence[ArgValue]] | Sequence[Mapping[str, ArgValue]] | None,
    every: bool,
) -> Iterator[tuple[str, Kwargs]]:
    """The map indexes of ``expand_kwargs``: one per dict of its list."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        dicts: Sequence[Any] = value
    elif every and isinstance(given, Sequence) and not isinstance(given, str):
        dicts = given
    elif every:
        raise BatchSpecError(
            f"{mapped.operator_class.__name__} (task_id: {mapped.task_id}): expand_kwargs maps over "
            f"{value!r}, known only when it runs: give its dicts, validate_mapped(task, context, "
            "expand=[{...}, ...])."
        )
    else:
        return
    for index, kwargs in enumerate(dicts[: None if every else MAX_PARSE_TIME_INDEXES]):
        if isinstance(kwargs, Mapping):
            yield f"map index {index}: {_VALUE.repr(dict(kwargs))}", dict(kwargs)
        elif every:
            raise BatchSpecError(
                f"{mapped.operator_class.__name__} (task_id: {mapped.task_id}): map index {index} is "
                f"{kwargs!r}, known only when it runs: give the dicts, validate_mapped(task, context, "
                "expand=[{...}, ...])."
            )


@contextlib.contextmanager
def _naming(mapped: MappedOperator, where: str) -> Iterator[None]:
    """Reword an error of one map index's checks so that it names the map index."""
    try:
        yield
    except (BatchSpecError, TypeError, ValueError) as err:
        if type(err) not in (BatchSpecError, TypeError, ValueError):
            raise  # a type of its own may take more than a message
        task, named = f"(task_id: {mapped.task_id})", f"(task_id: {mapped.task_id}, {where})"
        message = str(err)
        if task in message:
            message = message.replace(task, named, 1)
        else:
            message = f"{mapped.operator_class.__name__} {named}: {message}"
        raise type(err)(message) from None
