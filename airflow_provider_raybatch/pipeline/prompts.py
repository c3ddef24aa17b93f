"""Build each row's chat messages from the spec, or say exactly why the row cannot be prompted.

Pure functions of a record and the spec, so they are unit-tested without Ray.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from airflow_provider_raybatch.specs import BatchInferenceSpec, template_fields

RowFunction = Callable[[dict[str, Any]], dict[str, Any]]  # Any: user rows hold any values.


def load_callable(dotted_path: str) -> RowFunction:
    """Import ``pkg.module:function`` or ``pkg.module.function``."""
    module_name, sep, attribute = dotted_path.partition(":")
    if not sep:
        module_name, _, attribute = dotted_path.rpartition(".")
    module = importlib.import_module(module_name)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ImportError(f"{dotted_path!r}: {module_name} has no callable {attribute!r}.")
    return function


def _is_missing(value: Any) -> bool:  # Any: a cell value.
    return value is None or (isinstance(value, float) and value != value)  # NaN != NaN


def _render_user_message(spec: BatchInferenceSpec, row: dict[str, Any]) -> str:  # Any: cell values.
    template = spec.user_template or ""
    values = {}
    for column in template_fields(template):
        if column not in row:
            raise ValueError(f"missing column: user_template needs column {column!r}, which the row lacks")
        if _is_missing(row[column]) or str(row[column]).strip() == "":
            raise ValueError(f"empty prompt: column {column!r} used by user_template is empty")
        values[column] = row[column]
    return template.format(**values)


def _messages_from_column(spec: BatchInferenceSpec, row: dict[str, Any]) -> list[dict[str, Any]]:
    column = spec.messages_column
    messages = row.get(column)
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            raise ValueError(f"bad messages: column {column!r} is text but not JSON: {err.msg}") from err
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"bad messages: column {column!r} must hold a non-empty list of chat messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"bad messages: message {index} of column {column!r} needs 'role' and 'content'")
    if not any(str(m["content"]).strip() for m in messages):
        raise ValueError(f"empty prompt: every message of column {column!r} is empty")
    return messages


def build_messages(
    spec: BatchInferenceSpec, row: dict[str, Any], image_part: dict[str, Any] | None = None
) -> list[dict[str, Any]]:  # Any: cell values and JSON content parts.
    """The chat messages for one row; raises ValueError with a row-level reason.

    :param image_part: the row's image as a content part (``images.image_content_part``); the user
        message is then that image followed by the template's text, and every message's content is a
        list of parts, the shape the chat templates of vision-language models expect.
    """
    if spec.messages_column is not None:
        return _messages_from_column(spec, row)
    text = _render_user_message(spec, row)
    if image_part is None:
        messages = [{"role": "user", "content": text}]
        if spec.system_prompt:
            messages.insert(0, {"role": "system", "content": spec.system_prompt})
        return messages
    messages = [{"role": "user", "content": [image_part, {"type": "text", "text": text}]}]
    if spec.system_prompt:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": spec.system_prompt}]})
    return messages


def row_id(spec: BatchInferenceSpec, row: dict[str, Any], source: str) -> str:  # Any: cell values.
    """The id column's value as text, or the row's ``<file>:<row number>`` when no id column is set."""
    if spec.id_column is None:
        return source
    value = row.get(spec.id_column)
    if _is_missing(value) or str(value) == "":
        raise ValueError(f"missing id: id column {spec.id_column!r} is missing or empty")
    return str(value)
