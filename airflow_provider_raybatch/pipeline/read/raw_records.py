"""Where a CSV record ends, and what a CSV record or a JSONL line will cost once it is Python, read
from its bytes before anything of it is decoded or parsed.

Why: Python's ``csv`` and ``json`` build the whole record first and let us look after. A few bytes
can make far more objects (``[{},{},...]`` is about 80 B of Python a 3-byte ``{},``; a line of 50M
commas is a list of 50M cells), and one long field grows ``csv``'s buffer at 4 bytes a character.
So the readers (``jsonl_rows.py``, ``csv_rows.py``) ask here first and make a record that would cost
more than a row may its error row, unread. Every count is an upper bound, so a record read is within
the bound, and each takes a few passes of C over the bytes (``bytes.count``, a regular expression that
skips runs).

A text is charged its UTF-8 bytes times the width Python will hold its characters at (1, 2 or 4
bytes: a ``str`` takes its widest character's width for all of them, so one emoji makes a long
ASCII text four times its bytes). No Ray, pyarrow or Airflow here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# -- what a text costs ------------------------------------------------------------------------------

#: UTF-8 lead bytes of characters past U+FFFF (4 bytes a character in a ``str``) and past U+00FF (2).
_UTF8_WIDE = re.compile(rb"[\xf0-\xf4]")
_UTF8_HALF_WIDE = re.compile(rb"[\xc4-\xef]")
#: JSON escapes of the same: a high surrogate (the first of a pair past U+FFFF), and past U+00FF.
_ESCAPE_WIDE = re.compile(rb"\\u[dD][89abAB]")
_ESCAPE_HALF_WIDE = re.compile(rb"\\u(?!00)")


def char_width(raw: bytes, *, json_escapes: bool = False) -> int:
    """1, 2 or 4: at most the bytes a character of the text ``raw`` decodes to takes in a ``str``;
    ``json_escapes``: ``\\uXXXX`` escapes count as the characters they stand for."""
    escapes = json_escapes and b"\\u" in raw
    if raw.isascii() and not escapes:
        return 1
    if _UTF8_WIDE.search(raw) or (escapes and _ESCAPE_WIDE.search(raw)):
        return 4
    if _UTF8_HALF_WIDE.search(raw) or (escapes and _ESCAPE_HALF_WIDE.search(raw)):
        return 2
    return 1


# -- JSONL ------------------------------------------------------------------------------------------

#: What a JSON value costs in Python beside its text, as a Parquet value is charged (parquet_plan):
#: ``{}`` measured about 80 B (the dict, its slot in a list, its text in the row's JSON), a number
#: 16 to 32 B, an object's key about 100 B with its slot.
JSON_VALUE_COST = 128
#: A JSON string (escapes and all), or a byte that opens a value: what a string-aware count looks at.
#: The most a line's byte can cost: a value of its own, in a text 4 bytes a character. A line shorter
#: than the budget over this costs less whatever it holds, and is not counted.
JSON_BYTE_COST_AT_MOST = JSON_VALUE_COST + 4
_JSON_STRING_OR_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,:\[{]', re.DOTALL)
_QUOTE = ord('"')


def _json_tokens(line: bytes) -> int:
    """At least the values a JSON line holds: each value but the first follows a ``,``, ``:`` or
    ``[`` (the ``{`` counts each object), so this counts each at least once."""
    return line.count(b",") + line.count(b":") + line.count(b"[") + line.count(b"{") + 1


def _json_tokens_outside_strings(line: bytes, limit: int) -> int:
    """:func:`_json_tokens` with those inside strings left out, counted up to just past ``limit``
    (a match at a time: a line of millions of strings makes no list of them)."""
    count = 1
    for match in _JSON_STRING_OR_TOKEN.finditer(line):
        if line[match.start()] != _QUOTE:
            count += 1
            if count > limit:
                break
    return count


def json_line_cost(line: bytes, budget: int) -> int:
    """About what the line's value costs once Python holds it: its text at its width and
    :data:`JSON_VALUE_COST` a value. Over ``budget`` by a count of the line's bytes (commas inside
    strings count too), the values are counted again outside its strings, and that is the cost."""
    text = char_width(line, json_escapes=True) * len(line)
    cost = text + JSON_VALUE_COST * _json_tokens(line)
    if cost <= budget or text > budget:
        return cost
    return text + JSON_VALUE_COST * _json_tokens_outside_strings(line, (budget - text) // JSON_VALUE_COST)


#: A JSON escape of a UTF-16 surrogate: the one way a JSON line can hold text that is not UTF-8.
JSON_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


# -- CSV --------------------------------------------------------------------------------------------

# The records as Python's ``csv`` reads them (the excel dialect, not strict): a field that starts with
# a quote runs to its closing quote (``""`` inside is one quote; one never closed runs to the end of
# the file), and then, like an unquoted field, up to the next comma or line end, where a quote is a
# character. A record ends at a line end (``\r\n``, ``\r`` or ``\n``) outside quotes, or the file's end.
# A quote opens a quoted part only at a field's start: a record's start, or after a comma, which is
# never inside a quoted part here, as those are read whole. Runs are matched greedily a run at a
# time (possessive repeats of a class are far slower in ``re``).
_QUOTED = rb'"(?>[^"]*(?:""[^"]*)*)(?:"[^,\r\n]*)?'
_RECORD_BODY = rb"(?:" + _QUOTED + rb')?+(?:[^"\r\n]+|(?<=,)' + _QUOTED + rb'|")*+'
_CSV_RECORD = re.compile(_RECORD_BODY + rb"(?:\r\n|\r|\n|\Z)")
#: Whole records, each with its line end, as many as fit: where a span of records can end.
_CSV_WHOLE_RECORDS = re.compile(rb"(?:" + _RECORD_BODY + rb"(?:\r\n|\r|\n))*+")
_CSV_QUOTED_PART = re.compile(rb"(?<![^,\r\n])" + _QUOTED)  # at a field's start
_LINE_ENDS = (b"\n", b"\r", b"\r\n")


def csv_records(data: bytes, start: int, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """(start, end) of each CSV record from ``start`` (itself a record's start) to ``stop`` (one's end;
    default the file's), its line end included; a blank line is a record of its line end alone."""
    stop = len(data) if stop is None else stop
    for match in _CSV_RECORD.finditer(data, start):
        if match.start() >= stop:
            return
        yield match.span()


def csv_spans(data: bytes, start: int, span_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) of runs of whole CSV records from ``start``, each of at most ``span_bytes`` but a
    record longer alone: record ends are found a run at a time, not a record at a time. A ``\\r\\n``
    cut after its ``\\r`` leaves a blank line, which reads as none."""
    end = len(data)
    while start < end:
        stop = _end_of(_CSV_WHOLE_RECORDS.match(data, start, start + span_bytes), start)
        if stop == start:  # a record longer than a span, or the last one, without a line end
            stop = _end_of(_CSV_RECORD.match(data, start), end)
        yield start, stop
        start = stop


def _end_of(match: re.Match[bytes] | None, default: int) -> int:
    """Where ``match`` ends (both patterns match at any start, if only nothing), else ``default``."""
    return default if match is None else match.end()


def is_blank(data: bytes, start: int, end: int) -> bool:
    """Whether the record is a blank line, which ``csv`` reads as no cells (and the reader skips)."""
    return end - start <= 2 and data[start:end] in _LINE_ENDS


def line_ends(data: bytes, start: int, end: int) -> int:
    """At least the records from ``start`` to ``end`` (each ``\\r`` and ``\\n`` counted, one at least)."""
    return max(data.count(b"\n", start, end) + data.count(b"\r", start, end), 1)


def csv_cells_at_most(data: bytes, start: int, end: int) -> int:
    """At least the cells of the record (a comma inside quotes counted as well)."""
    return data.count(b",", start, end) + 1


def csv_cells(data: bytes, start: int, end: int, limit: int) -> int:
    """The record's cells (its commas outside quoted parts, plus one), counted up to just past
    ``limit``: a quoted part starts a field, so each after the first follows a comma counted."""
    cells, outside = 1, start
    for match in _CSV_QUOTED_PART.finditer(data, start, end):
        cells += data.count(b",", outside, match.start())
        outside = match.end()
        if cells > limit:
            return cells
    return cells + data.count(b",", outside, end)
