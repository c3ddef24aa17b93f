"""A record: one input row (or the reason it cannot be one), as the readers of every format make it.

A record is ``{"source": str, "row": str | None, "error": str | None}`` where ``row`` is the input
row as JSON text: rows of one file may disagree on types, and text keeps Ray's blocks uniform.
An error reason starts with its kind and a colon (``malformed CSV: row 3 has 4 fields, ...``).
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, time
from decimal import Decimal

from airflow_provider_raybatch.pipeline.read import json_text_cost, parquet_plan
from airflow_provider_raybatch.shared.json_types import CellValue, Row

Record = dict[str, str | None]


# -- JSON text of a row ---------------------------------------------------------------------------


def _set_items(value: set[CellValue] | frozenset[CellValue]) -> list[CellValue]:
    """A set as a list, sorted when its members sort, so equal sets give equal JSON."""
    items = list(value)
    try:
        return sorted(items)
    except TypeError:  # members of mixed types: keep them, in the set's order
        return items


def _numpy_value(value: CellValue) -> CellValue:
    """A numpy value as plain Python; never ``str``, which elides arrays past 1,000 items with ``...``."""
    if getattr(getattr(value, "dtype", None), "kind", "") in ("M", "m"):
        # datetime64 / timedelta64: .tolist() gives bare ints at nanosecond units; text keeps the meaning.
        return value.astype(str).tolist()
    return value.tolist()  # nested arrays become nested lists; object items come back to _json_default


def _json_default(value: CellValue) -> CellValue:
    """A JSON value for a cell ``json`` cannot write itself; ``json`` encodes what this returns again."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)  # text keeps every digit; a float would not
    if isinstance(value, bytes | bytearray | memoryview):  # exactly, as a data URL (text would lose bytes)
        return BYTES_DATA_URL_PREFIX + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, set | frozenset):
        return _set_items(value)
    # Checked by module name so that rows never import numpy; a preprocess may return its values.
    if type(value).__module__.partition(".")[0] == "numpy" and hasattr(value, "tolist"):
        return _numpy_value(value)
    return str(value)


#: One encoder for every row: ``json.dumps`` given any option makes a new one at each call, a fifth
#: of the time a short row takes to write.
_ROW_ENCODER = json.JSONEncoder(default=_json_default, ensure_ascii=False)


def row_to_json(row: Row) -> str:
    """A row as JSON text; read back with ``json.loads`` (NaN and Infinity tokens may appear)."""
    return _ROW_ENCODER.encode(row)


#: Prefix of the data URL that carries a binary column's bytes through a row's JSON unchanged.
BYTES_DATA_URL_PREFIX = "data:application/octet-stream;base64,"


def _keep_bytes(value: CellValue) -> CellValue:
    """Bytes (also inside a struct) -> a base64 data URL, so that JSON keeps them exactly."""
    if isinstance(value, bytes | bytearray | memoryview):
        return BYTES_DATA_URL_PREFIX + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {key: _keep_bytes(item) for key, item in value.items()}
    return value


def ok(source: str, row: Row, binary_columns: tuple[str, ...] = (), raw_size: int | None = None) -> Record:
    """A row's record; ``raw_size``: the bytes (or characters) of the line or record it was read from,
    if known, 0 where its cost was checked already."""
    for column in binary_columns:
        if column in row:
            row = {**row, column: _keep_bytes(row[column])}
    if raw_size != 0 and (too_large := json_text_cost.json_text_too_large(row, raw_size)):
        return bad(
            source,
            f"row too large: its JSON text would take up to {too_large:,} bytes, more than a row's may "
            f"({json_text_cost.MAX_JSON_TEXT_BYTES:,}); keep each row's values under 64 MiB of plain text",
        )
    try:
        text = row_to_json(row)
    except Exception as err:  # noqa: BLE001 - e.g. RecursionError on a deep value: the row fails, not the job
        return bad(source, f"unserializable row: {type(err).__name__}: {str(err)[:200]}")
    return {"source": source, "row": text, "error": None}


#: How much of a line that could not be read as a row its error row keeps (as ``input``).
RAW_LINE_KEPT_CHARS = 64 * 1024


def bad(source: str, error: str, raw: bytes | str | None = None) -> Record:
    """An error record; ``raw``: the line or cells as read, kept (as a JSON string, bad bytes
    replaced, cut at ``RAW_LINE_KEPT_CHARS``) so that the error row shows what was written."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    kept = None if raw is None else json.dumps(raw[:RAW_LINE_KEPT_CHARS], ensure_ascii=False)
    return {"source": source, "row": kept, "error": error}


def unreadable(name: str, input_format: str, why: str) -> Record:
    """The record of a file that cannot be read, or read on (row number 0: no row of the file)."""
    return bad(f"{name}:0", f"unreadable file: not valid {input_format}: {why}")


#: The most a JSONL line or a CSV record may cost once Python holds its values (raw_records: its text
#: at the width Python holds it, and what each value or cell adds): a line or record over it is its
#: error row, unparsed, as a Parquet row of more values is (``PARQUET_DECODE_BYTES``).
RECORD_BYTES = parquet_plan.PARQUET_DECODE_BYTES


def record_too_large(what: str) -> str:
    return (
        f"row too large: {what} would take more than a row may once read ({RECORD_BYTES:,} bytes: its "
        "text, and what each value adds); keep each row's values (text, images) under that"
    )
