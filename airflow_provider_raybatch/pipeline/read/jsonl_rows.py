"""JSONL input: one JSON object a line, each line its own row or its own error row."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from airflow_provider_raybatch.pipeline.read import column_bound, raw_records, records
from airflow_provider_raybatch.pipeline.read.records import RAW_LINE_KEPT_CHARS, Record, bad, ok
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.jsonl import split_lines


def _json_object(line: bytes, number: int) -> JsonObject | str:
    """One JSONL line's object, or the reason it is not one; a line that would cost more than
    :data:`.records.RECORD_BYTES` is not parsed (its bytes first: a 500 MB line is never counted)."""
    bound = records.RECORD_BYTES
    if (len(line) + 1) * raw_records.JSON_BYTE_COST_AT_MOST > bound:  # long enough to count
        cost = len(line) if len(line) > bound else raw_records.json_line_cost(line, bound)
        if cost > bound:
            size = f"over {bound:,}" if len(line) > bound else f"{len(line):,}"  # cut if over
            return records.record_too_large(f"line {number} ({size} bytes)")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"invalid UTF-8: byte {err.start} of line {number}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"malformed JSON: line {number}, column {err.colno}: {err.msg}"
    except (ValueError, RecursionError) as err:  # an int of over 4,300 digits; nesting past the stack
        return f"unsupported JSON: line {number}: {type(err).__name__}: {str(err)[:200]}"
    if not isinstance(value, dict):
        return f"not a JSON object: line {number} is a JSON {type(value).__name__}"
    return value


#: A lone surrogate (what a ``\ud800`` escape without its pair decodes to): it has no UTF-8 form.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8_text(record: Record) -> Record:
    """The record with each lone surrogate in its row's JSON text written as its escape (the same
    JSON), so that an Arrow block of records (Ray Data's) can hold it: the whole block would fail on
    it. Nothing else is escaped, so the text is as long as checked, but for five characters a
    surrogate. The row steps read it back and handle it (row_steps._utf8_safe)."""
    text = record["row"]
    if text is None or not _SURROGATE.search(text):
        return record
    return {**record, "row": _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)}


def jsonl_records(name: str, data: bytes) -> Iterator[Record]:
    # Lines end at \n only, the rule the API counts requests by (jsonl.py): a bare \r stays in its
    # line, and U+2028 or U+0085 inside a string (UTF-8 bytes without \n) too, as JSON Lines requires.
    columns = column_bound.FileColumns()
    for number, line in split_lines(data, max_bytes=records.RECORD_BYTES):  # a longer line is cut, refused
        value = _json_object(line, number)
        source = f"{name}:{number}"
        if not isinstance(value, str):
            value = columns.refusal(value) or value
        if isinstance(value, str):  # its error row shows the line's start, never 500 MB decoded
            yield bad(source, value, raw=line[: 4 * RAW_LINE_KEPT_CHARS])
        elif b"\\u" in line and raw_records.JSON_SURROGATE_ESCAPE.search(line):  # only such can hold one
            yield _utf8_text(ok(source, value, raw_size=len(line)))
        else:
            yield ok(source, value, raw_size=len(line))
