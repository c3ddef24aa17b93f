"""Numbers a JSON value holds that may not be handed on as a number: integers past int64, and floats
that are NaN or infinite.

The spec checks a setting with it (``specs.py``), the pipeline a request's body before it reaches the
engine (``pipeline/openai/openai_batch.py``). Such numbers are fine as cells (the pipeline writes a
column of them as JSON text: ``pipeline/stage/part_schema.py``), but a parameter is handed on as a
number: an int64 column, a torch seed, a C loop bound.
"""

from __future__ import annotations

import math
from typing import Any

from airflow_provider_raybatch.shared.json_types import JsonValue

#: The integers a number column or an engine parameter can hold (Arrow's int64; vLLM's and torch's seeds).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def unsafe_number(value: JsonValue, where: str) -> tuple[str, str] | None:
    """(its path, why) of the first integer past int64 or float that is NaN or infinite in ``value``
    (nested ones too), with paths starting at ``where``; None when there is none.

    Iterative, and each step's path is a link to its parent's, so a line nested as deeply
    as the JSON parser allows is walked in linear time without recursion.
    """
    stack: list[tuple[Any, _PathLink]] = [(value, None)]  # Any: the value
    while stack:
        item, link = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            path = _path_text(where, link)
            return path, f"{path}: {_short_number(item)} is out of range (at most 64-bit integers)"
        if isinstance(item, float) and not math.isfinite(item):
            path = _path_text(where, link)
            return path, f"{path}: {item} is not a finite number"
        if isinstance(item, dict):
            stack.extend((child, (link, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((child, (link, index)) for index, child in reversed(list(enumerate(item))))
    return None


#: A path from the top of a value: None at the top, else (the parent's link, a key or an index).
_PathLink = tuple[Any, Any] | None  # Any: the parent's link (recursive), a dict key or a list index


def _path_text(where: str, link: _PathLink) -> str:
    """``body.messages[0].x``: keys that are names after a dot, others (and indexes) in brackets."""
    keys = []
    while link is not None:
        link, key = link
        keys.append(key)
    keys.reverse()
    if len(keys) > _PATH_KEYS_SHOWN:  # nested deeply: the first steps and the last ones
        half = _PATH_KEYS_SHOWN // 2
        return _path_steps(where, keys[:half]) + "[...]" + _path_steps("", keys[-half:])
    return _path_steps(where, keys)


_PATH_KEYS_SHOWN = 8


def _path_steps(text: str, keys: list[Any]) -> str:  # Any: dict keys and list indexes.
    for key in keys:
        if isinstance(key, str) and key.isidentifier() and len(key) <= 60:
            text += f".{key}"
        else:
            shown = repr(key)
            text += f"[{shown if len(shown) <= 60 else shown[:57] + '...'}]"
    return text


def _short_number(number: int) -> str:
    """An integer's digits, cut in the middle past 40 (a line may hold one of 4,000 digits)."""
    digits = str(number)
    return digits if len(digits) <= 40 else f"{digits[:18]}...{digits[-18:]} ({len(digits)} digits)"
