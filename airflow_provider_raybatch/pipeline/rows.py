"""Turn one input file's bytes into row records, each with a stable source and never a lost row.

We parse whole files ourselves (Ray Data hands us the bytes, one file per row) for two reasons
Ray's readers cannot serve: a deterministic ``<file>:<row number>`` id for inputs without an id
column, and one bad JSON line becoming one error row instead of a failed job.

A record is ``{"source": str, "row": str | None, "error": str | None}`` where ``row`` is the input
row as JSON text: rows of one file may disagree on types, and text keeps Ray's blocks uniform.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from airflow_provider_raybatch.specs import InputFormat

Record = dict[str, str | None]


def _json_default(value: Any) -> Any:  # Any: whatever pyarrow hands back for a cell.
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def row_to_json(row: dict[str, Any]) -> str:  # Any: cell values.
    return json.dumps(row, default=_json_default, ensure_ascii=False)


#: Prefix of the data URL that carries a binary column's bytes through a row's JSON unchanged.
BYTES_DATA_URL_PREFIX = "data:application/octet-stream;base64,"


def _keep_bytes(value: Any) -> Any:  # Any: a cell, e.g. an image struct {"bytes": ..., "path": ...}.
    """Bytes (also inside a struct) -> a base64 data URL, so that JSON keeps them exactly."""
    if isinstance(value, bytes | bytearray | memoryview):
        return BYTES_DATA_URL_PREFIX + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {key: _keep_bytes(item) for key, item in value.items()}
    return value


def _ok(source: str, row: dict[str, Any], binary_columns: tuple[str, ...] = ()) -> Record:  # Any: cells.
    for column in binary_columns:
        if column in row:
            row = {**row, column: _keep_bytes(row[column])}
    return {"source": source, "row": row_to_json(row), "error": None}


def _bad(source: str, error: str) -> Record:
    return {"source": source, "row": None, "error": error}


def _jsonl_records(name: str, data: bytes) -> Iterator[Record]:
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark some editors write
    for number, raw_line in enumerate(data.splitlines(), start=1):
        source = f"{name}:{number}"
        if not raw_line.strip():
            continue
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as err:
            yield _bad(source, f"invalid UTF-8: byte {err.start} of line {number}")
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            yield _bad(source, f"malformed JSON: line {number}, column {err.colno}: {err.msg}")
            continue
        if not isinstance(value, dict):
            yield _bad(source, f"not a JSON object: line {number} is a JSON {type(value).__name__}")
            continue
        yield _ok(source, value)


def _table_records(name: str, table: Any, binary_columns: tuple[str, ...]) -> Iterator[Record]:  # Any: Table.
    for number, row in enumerate(table.to_pylist(), start=1):
        yield _ok(f"{name}:{number}", row, binary_columns)


def parse_file(
    name: str, data: bytes, input_format: InputFormat, binary_columns: tuple[str, ...] = ()
) -> Iterator[Record]:
    """Records of one file; a file that cannot be read at all becomes one error record.

    :param binary_columns: columns whose bytes (Parquet binary, also inside a struct such as an image's
        ``{"bytes": ..., "path": ...}``) are kept exactly, as ``BYTES_DATA_URL_PREFIX`` data URLs;
        other bytes become text (UTF-8, bad bytes replaced).
    """
    if input_format == "jsonl":
        yield from _jsonl_records(name, data)
        return
    try:
        if input_format == "csv":
            import pyarrow.csv as pa_csv

            table = pa_csv.read_csv(io.BytesIO(data))
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - any reader failure is reported as the file's error row.
        yield _bad(f"{name}:0", f"unreadable file: not valid {input_format}: {type(err).__name__}: {err}")
        return
    yield from _table_records(name, table, binary_columns)
