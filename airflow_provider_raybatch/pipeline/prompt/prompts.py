"""Build each row's chat messages from the spec, or say exactly why the row cannot be prompted.

Pure functions of a record and the spec, so they are unit-tested without Ray.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import string
from collections.abc import Callable

from airflow_provider_raybatch.pipeline.row_marks import MAX_ID_CHARS
from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, Row
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec, TemplateField, parse_user_template
from airflow_provider_raybatch.shared.user_functions import split_dotted_path

RowFunction = Callable[[Row], Row]


def load_callable(dotted_path: str) -> RowFunction:
    """Import ``pkg.module:function`` or ``pkg.module.function``."""
    module_name, attribute = split_dotted_path(dotted_path)
    module = importlib.import_module(module_name)
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ImportError(f"{dotted_path!r}: {module_name} has no callable {attribute!r}.")
    return function


def _is_missing(value: CellValue) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # NaN != NaN


@functools.lru_cache(maxsize=16)
def _template_pieces(template: str) -> tuple[str | TemplateField, ...]:
    """:func:`parse_user_template`, once a template rather than once a row."""
    return tuple(parse_user_template(template))


def _render_user_message(spec: BatchInferenceSpec, row: Row) -> str:
    """``user_template`` filled with the row's columns (``specs.parse_user_template``: only ``{Column}``
    is a field, every other brace is literal text), each field formatted alone so that a reason names
    its column (``{score:.1f}`` on a list is that row's error, not the job's)."""
    formatter = string.Formatter()
    pieces = []
    for piece in _template_pieces(spec.user_template or ""):
        if isinstance(piece, str):
            pieces.append(piece)
            continue
        column = piece.name
        if column not in row:
            raise ValueError(f"missing column: user_template needs column {column!r}, which the row lacks")
        value = row[column]
        if _is_missing(value) or str(value).strip() == "":
            raise ValueError(f"empty prompt: column {column!r} used by user_template is empty")
        try:
            converted = formatter.convert_field(value, piece.conversion)
            pieces.append(formatter.format_field(converted, piece.format_spec))
        except Exception as err:  # noqa: BLE001 - any value the spec cannot format fails this row only
            raise ValueError(
                f"bad template value: column {column!r} holds a {type(value).__name__} that {piece.text} "
                f"cannot format: {type(err).__name__}: {err}"
            ) from err
    return "".join(pieces)


def messages_from_column(column: str, row: JsonObject) -> list[JsonObject]:
    """The chat messages a row holds in ``column`` (a list, or its JSON text); raises ValueError with
    the row's reason."""
    messages = row.get(column)
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"bad messages: column {column!r} is text but not JSON: {err.msg}; it must hold a "
                'non-empty list of chat messages, e.g. [{"role": "user", "content": "..."}]'
            ) from err
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"bad messages: column {column!r} must hold a non-empty list of chat messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"bad messages: message {index} of column {column!r} needs 'role' and 'content'")
    if not any(str(m["content"]).strip() for m in messages):
        raise ValueError(f"empty prompt: every message of column {column!r} is empty")
    return messages


def build_messages(spec: BatchInferenceSpec, row: Row, image_part: Row | None = None) -> list[Row]:
    """The chat messages for one row; raises ValueError with a row-level reason.

    :param image_part: the row's image as a content part (``images.image_content_part``); the user
        message is then that image followed by the template's text, and every message's content is a
        list of parts, the shape the chat templates of vision-language models expect.
    """
    if spec.messages_column is not None:
        return messages_from_column(spec.messages_column, row)
    text = _render_user_message(spec, row)
    messages: list[Row]
    if image_part is None:
        messages = [{"role": "user", "content": text}]
        if spec.system_prompt:
            messages.insert(0, {"role": "system", "content": spec.system_prompt})
        return messages
    messages = [{"role": "user", "content": [image_part, {"type": "text", "text": text}]}]
    if spec.system_prompt:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": spec.system_prompt}]})
    return messages


def id_text(value: CellValue, column: str) -> str:
    """An id cell's one canonical text: text as it is; JSON numbers as JSON writes them (``7``,
    ``7.5``, ``1e+300``); ``true``/``false``. Raises ValueError for a missing, empty, nested or too long
    id (NaN and Infinity count as missing: they identify nothing)."""
    if isinstance(value, str) and value != "":
        if len(value) > MAX_ID_CHARS:
            raise ValueError(
                f"bad id: id column {column!r} holds {len(value):,} characters, more than an id may "
                f"({MAX_ID_CHARS:,})"
            )
        return value
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return json.dumps(value)
    if isinstance(value, dict | list):
        raise ValueError(
            f"bad id: id column {column!r} holds a JSON {_json_kind(value)}; an id must be text or a number"
        )
    raise ValueError(f"missing id: id column {column!r} is missing or empty")


def _json_kind(value: CellValue) -> str:
    kinds: dict[type, str] = {dict: "object", list: "array"}
    return kinds.get(type(value), type(value).__name__)


def row_id(spec: BatchInferenceSpec, row: Row, source: str) -> str:
    """The id column's value as text (:func:`id_text`), or the row's ``<file>:<row number>`` when no
    id column is set."""
    if spec.id_column is None:
        return source
    return id_text(row.get(spec.id_column), spec.id_column)
