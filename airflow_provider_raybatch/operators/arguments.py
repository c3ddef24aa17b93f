"""An operator's arguments as a DAG author writes them: misspelled names, and which values are literal.

Airflow refuses an unknown argument with "Invalid arguments were passed", naming no likely spelling;
this names it. A literal value (no template, no XCom) can be checked as the DAG is parsed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_raybatch.specs import did_you_mean

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
    named = ", ".join(f"{name!r}{did_you_mean(name, known)}" for name in unknown)
    task = f" (task_id: {given['task_id']})" if "task_id" in given else ""
    raise TypeError(f"{operator}{task} got unknown argument{'s' if len(unknown) > 1 else ''} {named}.")


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
