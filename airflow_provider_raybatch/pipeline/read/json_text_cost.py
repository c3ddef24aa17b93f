"""How large a row's JSON text will be, at most, before ``json.dumps`` makes it.

JSON writes a control character as six characters, and Python holds a text at four bytes a
character once one of its characters is past U+FFFF: a CSV cell or a JSONL string of 60 MiB can
become over a GiB of JSON text. A row from a line or record of ``raw_bytes`` bytes makes at most
:data:`JSON_GROWTH` times that, so most rows need no look at their values; a larger one is walked,
each text counted for what JSON escapes in it, and the walk stops once the row is over the bound.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

#: What a row's JSON text may take in Python: a record of 64 MiB of plain text, and half as much again.
MAX_JSON_TEXT_BYTES = 96 << 20
#: The most bytes of JSON text one byte of a line or record makes: a control character's six
#: characters, each at four bytes where the text also holds a character past U+FFFF.
JSON_GROWTH = 24
#: What JSON writes of a number, a boolean, a null or a date, at most (a 76-digit decimal's text).
_SCALAR_CHARS = 100
#: The bytes JSON writes escaped: control characters (``\u00XX``: five more) and the quote and
#: backslash (one more each); counted as five more each.
_ESCAPED = bytes(range(0x20)) + b'"\\'
#: Characters of a long text encoded at a time to count its escapes: a few MiB beside the text.
_COUNT_CHUNK = 4 << 20


def json_text_too_large(row: Mapping[str, object], raw_bytes: int | None) -> int | None:
    """The bytes the row's JSON text may take where that is over :data:`MAX_JSON_TEXT_BYTES`, else
    None; ``raw_bytes``: the size of the line or record the row was read from, if known."""
    if raw_bytes is not None and raw_bytes * JSON_GROWTH <= MAX_JSON_TEXT_BYTES:
        return None
    characters, width = 0, 1
    pending: list[object] = [row]
    # A container met again is counted once: a cycle (json.dumps refuses it itself), or one shared,
    # which no reader makes (json.loads, csv and pyarrow make each value anew).
    walked: set[int] = set()
    while pending:
        value = pending.pop()
        if isinstance(value, Mapping | list | tuple):
            if id(value) in walked:
                continue
            walked.add(id(value))
        if isinstance(value, str):
            length, text_width = _text(value)
            characters += length
            width = max(width, text_width)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                length, text_width = _text(str(key))
                characters += length + 2
                width = max(width, text_width)
                pending.append(item)
        elif isinstance(value, list | tuple):
            characters += 2 + len(value)
            pending.extend(value)
        elif isinstance(value, bytes | bytearray):
            characters += (len(value) + 2) // 3 * 4 + 40  # a base64 data URL
        else:
            characters += _SCALAR_CHARS
        if characters * width > MAX_JSON_TEXT_BYTES:
            return characters * width
    return None


def _text(text: str) -> tuple[int, int]:
    """A text's JSON characters (escapes counted where they could matter) and its width in Python."""
    length = len(text)
    width = 1 if text.isascii() else _width(text)
    if 6 * length * width <= MAX_JSON_TEXT_BYTES // 8:  # small: charged as if each character escaped
        return 6 * length + 2, width
    escaped = 0
    for start in range(0, length, _COUNT_CHUNK):
        part = text[start : start + _COUNT_CHUNK].encode("utf-8", "surrogatepass")
        escaped += len(part) - len(part.translate(None, _ESCAPED))
    return length + 5 * escaped + 2, width


def _width(text: str) -> int:
    """Bytes a character of a non-ASCII text in Python: its object's size tells, without a scan."""
    payload = sys.getsizeof(text) - sys.getsizeof("")
    return 4 if payload >= 4 * len(text) else 2 if payload >= 2 * len(text) else 1
