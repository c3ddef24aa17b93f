"""Turn one input file's bytes into row records, each with a stable source and never a lost row.

We parse whole files ourselves (Ray Data hands us the bytes, one file per row) for two reasons
Ray's readers cannot serve: a deterministic ``<file>:<row number>`` id for inputs without an id
column, and one bad line or row becoming one error row instead of a failed job.

A record is ``{"source": str, "row": str | None, "error": str | None}`` where ``row`` is the input
row as JSON text: rows of one file may disagree on types, and text keeps Ray's blocks uniform.
An error reason starts with its kind and a colon (``malformed CSV: row 3 has 4 fields, ...``).

CSV is read twice over: Python's ``csv`` module decides the structure (quoted newlines stay in their
field, and it hands us each record so a ragged one fails alone), then pyarrow reads the good records
again to infer each column's type as Ray Data's ``read_csv`` would, wherever that keeps what users
wrote: the id column, numbers with leading zeros or too many digits (``02134`` is not ``2134``), and
dates and times stay the text as written. Both read a chunk of records at a time (``CSV_CHUNK_BYTES``):
the file's records are never all Python at once, and each column's type is the one over all chunks.
"""

from __future__ import annotations

import base64
import codecs
import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import (
    arrow_types,
    column_bound,
    json_text_cost,
    parquet_plan,
    raw_records,
    row_costs,
)
from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, Row
from airflow_provider_raybatch.shared.jsonl import BYTE_ORDER_MARK, split_lines
from airflow_provider_raybatch.shared.specs import InputFormat

if TYPE_CHECKING:
    import pyarrow as pa

Record = dict[str, str | None]

# Bytes that are not UTF-8 decode to these under "surrogateescape", and valid UTF-8 never does,
# so a CSV row can fail for its own bad bytes while the rest of the file parses.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


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


def _ok(source: str, row: Row, binary_columns: tuple[str, ...] = (), raw_size: int | None = None) -> Record:
    """A row's record; ``raw_size``: the bytes (or characters) of the line or record it was read from,
    if known, 0 where its cost was checked already."""
    for column in binary_columns:
        if column in row:
            row = {**row, column: _keep_bytes(row[column])}
    if raw_size != 0 and (too_large := json_text_cost.json_text_too_large(row, raw_size)):
        return _bad(
            source,
            f"row too large: its JSON text would take up to {too_large:,} bytes, more than a row's may "
            f"({json_text_cost.MAX_JSON_TEXT_BYTES:,}); keep each row's values under 64 MiB of plain text",
        )
    try:
        text = row_to_json(row)
    except Exception as err:  # noqa: BLE001 - e.g. RecursionError on a deep value: the row fails, not the job
        return _bad(source, f"unserializable row: {type(err).__name__}: {str(err)[:200]}")
    return {"source": source, "row": text, "error": None}


#: How much of a line that could not be read as a row its error row keeps (as ``input``).
RAW_LINE_KEPT_CHARS = 64 * 1024


def _bad(source: str, error: str, raw: bytes | str | None = None) -> Record:
    """An error record; ``raw``: the line or cells as read, kept (as a JSON string, bad bytes
    replaced, cut at ``RAW_LINE_KEPT_CHARS``) so that the error row shows what was written."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    kept = None if raw is None else json.dumps(raw[:RAW_LINE_KEPT_CHARS], ensure_ascii=False)
    return {"source": source, "row": kept, "error": error}


def _unreadable(name: str, input_format: str, why: str) -> Record:
    """The record of a file that cannot be read, or read on (row number 0: no row of the file)."""
    return _bad(f"{name}:0", f"unreadable file: not valid {input_format}: {why}")


# -- JSONL ----------------------------------------------------------------------------------------


#: The most a JSONL line or a CSV record may cost once Python holds its values (raw_records: its text
#: at the width Python holds it, and what each value or cell adds): a line or record over it is its
#: error row, unparsed, as a Parquet row of more values is (``PARQUET_DECODE_BYTES``).
RECORD_BYTES = parquet_plan.PARQUET_DECODE_BYTES


def _record_too_large(what: str) -> str:
    return (
        f"row too large: {what} would take more than a row may once read ({RECORD_BYTES:,} bytes: its "
        "text, and what each value adds); keep each row's values (text, images) under that"
    )


def _json_object(line: bytes, number: int) -> JsonObject | str:
    """One JSONL line's object, or the reason it is not one; a line that would cost more than
    :data:`RECORD_BYTES` is not parsed (its bytes first: a 500 MB line is never counted)."""
    if (len(line) + 1) * raw_records.JSON_BYTE_COST_AT_MOST > RECORD_BYTES:  # long enough to count
        cost = len(line) if len(line) > RECORD_BYTES else raw_records.json_line_cost(line, RECORD_BYTES)
        if cost > RECORD_BYTES:
            size = f"over {RECORD_BYTES:,}" if len(line) > RECORD_BYTES else f"{len(line):,}"  # cut if over
            return _record_too_large(f"line {number} ({size} bytes)")
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


def _jsonl_records(name: str, data: bytes) -> Iterator[Record]:
    # Lines end at \n only, the rule the API counts requests by (jsonl.py): a bare \r stays in its
    # line, and U+2028 or U+0085 inside a string (UTF-8 bytes without \n) too, as JSON Lines requires.
    columns = column_bound.FileColumns()
    for number, line in split_lines(data, max_bytes=RECORD_BYTES):  # a longer line is cut, refused
        value = _json_object(line, number)
        source = f"{name}:{number}"
        if not isinstance(value, str):
            value = columns.refusal(value) or value
        if isinstance(value, str):  # its error row shows the line's start, never 500 MB decoded
            yield _bad(source, value, raw=line[: 4 * RAW_LINE_KEPT_CHARS])
        elif b"\\u" in line and raw_records.JSON_SURROGATE_ESCAPE.search(line):  # only such can hold one
            yield _utf8_text(_ok(source, value, raw_size=len(line)))
        else:
            yield _ok(source, value, raw_size=len(line))


# -- Arrow tables (Parquet, and CSV after type inference) -------------------------------------------


def _unique_names(names: list[str]) -> list[str]:
    """Column names with repeats renamed pandas-style, so that no column is lost to a dict key.

    The first ``Name`` keeps its name; later ones become ``Name.1``, ``Name.2``, ... skipping any
    name the header already has (``a, a, a.1`` -> ``a, a.2, a.1``), so a column keeps the name
    its file gives it whenever that name is unique.
    """
    taken = set(names)
    seen: set[str] = set()
    last_suffix: dict[str, int] = {}
    unique: list[str] = []
    for name in names:
        if name in seen:
            suffix = last_suffix.get(name, 0) + 1
            while f"{name}.{suffix}" in taken:
                suffix += 1
            last_suffix[name] = suffix
            taken.add(f"{name}.{suffix}")
            name = f"{name}.{suffix}"
        seen.add(name)
        unique.append(name)
    return unique


def _scalar_text(scalar: pa.Scalar) -> str:
    """A cell's text form, for a value Python cannot hold (a timestamp past year 9999, a date32 of
    two billion days): Arrow's own cast to string, else ``str``, else a note of its type."""
    import pyarrow as pa

    try:
        return str(scalar.cast(pa.string()).as_py())
    except Exception:  # noqa: BLE001 - no cast for this type: try the next form
        pass
    try:
        return str(scalar)
    except Exception:  # noqa: BLE001 - str() of some scalars converts them, and fails the same way
        return f"<{scalar.type} value that Python cannot hold>"


def _scalar_value(scalar: pa.Scalar) -> CellValue:
    """A cell's Python value; parts that Python cannot hold become their text, the rest stay values."""
    try:
        return scalar.as_py()
    except Exception:  # noqa: BLE001 - a cell's value must never fail its row or its file
        pass
    import pyarrow as pa

    if isinstance(scalar, pa.StructScalar):
        return {scalar.type.field(i).name: _scalar_value(scalar[i]) for i in range(scalar.type.num_fields)}
    if isinstance(scalar, pa.MapScalar):
        return [(_scalar_value(entry[0]), _scalar_value(entry[1])) for entry in scalar.values]
    inner = getattr(scalar, "values", None)  # list, large list, fixed-size list, list view
    if isinstance(inner, pa.Array):
        return [_scalar_value(item) for item in inner]
    inner = getattr(scalar, "value", None)  # dictionary, union and extension cells wrap a scalar
    if isinstance(inner, pa.Scalar):
        return _scalar_value(inner)
    return _scalar_text(scalar)


def _column_values(column: pa.ChunkedArray) -> list[CellValue]:
    """A column's Python values: all at once (fast), else cell by cell when one cell cannot convert."""
    try:
        return column.to_pylist()
    except Exception:  # noqa: BLE001 - e.g. OverflowError on 9999-12-31 in a time zone east of UTC
        return [_scalar_value(scalar) for chunk in column.chunks for scalar in chunk]


def _table_rows(table: pa.Table) -> list[Row]:
    names = _unique_names(table.column_names)
    if not names:  # a Parquet file may have rows and no columns: each row is still a row
        return [{} for _ in range(table.num_rows)]
    columns = [_column_values(column) for column in table.columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _is_bytes(data_type: pa.DataType) -> bool:
    """Text or bytes (of any width), dictionary-encoded or not."""
    import pyarrow as pa

    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    return any(
        check(data_type)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    )


def _dictionaries_decoded(table: pa.Table) -> pa.Table:
    """The table with its dictionary columns as plain ones (a slice bounded in bytes: cheap to turn
    into Python, where a dictionary column goes cell by cell)."""
    import pyarrow as pa

    columns = [
        column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, names=table.column_names)


def _slices_of(table: pa.Table, budget: int) -> Iterator[tuple[int, int, int, int]]:
    """(start, stop, held, text) of consecutive rows of ``table`` that hold at most ``budget`` bytes
    once records (:mod:`.row_costs`), and the bytes of their JSON text; a row over ``budget`` alone
    is a slice of its own."""
    costs = row_costs.row_costs(table)
    held_total = int(costs.held.sum())
    if held_total <= budget:  # the usual batch: one slice
        yield 0, table.num_rows, held_total, int(costs.text.sum())
        return
    start, held, text = 0, 0, 0
    for index, (size, length) in enumerate(zip(costs.held.tolist(), costs.text.tolist(), strict=True)):
        if index > start and (held + size > budget or size > budget):
            yield start, index, held, text
            start, held, text = index, 0, 0
        held += size
        text += length
    if start < table.num_rows:
        yield start, table.num_rows, held, text


def _parquet_records(name: str, data: bytes, binary_columns: tuple[str, ...]) -> Iterator[Record]:
    """A Parquet file's records, read within :mod:`.parquet_plan`'s bounds: a batch of rows at a time
    as its plan sizes it, each turned into Python a slice of rows at a time, a slice costing at most
    ``row_costs.ROW_COST_BYTES`` once records."""
    import pyarrow as pa

    number = 0
    try:
        # Before pyarrow opens the file: a type off the allowlist may run the file's code (arrow_types).
        schema, metadata = arrow_types.checked_parquet_footer(data, parquet_plan.MAX_FOOTER_BYTES)
        if shape_refused := column_bound.schema_refusal(schema):
            yield _unreadable(name, "parquet", shape_refused)
            return
        plan = parquet_plan.plan_reading(data, metadata, schema)
        # ParquetFile, not read_table: the dataset layer refuses a file with a repeated column name. A
        # BufferReader: pyarrow reads the file's pages in place, where a Python file would copy them.
        parquet = arrow_types.open_parquet(
            pa.BufferReader(data), read_dictionary=plan.dictionary_columns, metadata=metadata
        )
        decoded = 0
        for batch in parquet_plan.planned_batches(parquet, plan):
            table = pa.Table.from_batches([batch])
            for start, stop, held, text in _slices_of(table, row_costs.ROW_COST_BYTES):
                # A dictionary's value, or a column's name, counts at each row that uses it: a few
                # KiB of indices can stand for gigabytes of rows, which the file's pages do not bound.
                decoded += text
                if decoded > parquet_plan.MAX_INPUT_DECODED_BYTES:
                    yield _unreadable(name, "parquet", _decodes_past_bound(number))
                    return
                if held > row_costs.ROW_COST_BYTES:  # one row, alone over the budget
                    number += 1
                    yield _bad(f"{name}:{number}", _row_too_large(held))
                    continue
                for row in _table_rows(_dictionaries_decoded(table.slice(start, stop - start))):
                    number += 1
                    yield _ok(f"{name}:{number}", row, binary_columns, raw_size=0)  # costed: row_costs
    except (
        arrow_types.RefusedArrowTypeError,
        arrow_types.FooterTooLongError,
        parquet_plan.ParquetBoundError,
    ) as err:
        yield _unreadable(name, "parquet", str(err))
    except Exception as err:  # noqa: BLE001 - any reader failure is reported as the file's error row.
        after = f" after its row {number}" if number else ""
        yield _unreadable(name, "parquet", f"{type(err).__name__}{after}: {err}")


def _decodes_past_bound(rows_read: int) -> str:
    return _writes_past_bound(rows_read, "a dictionary's value and each column's name counted at each row")


def _writes_past_bound(
    rows_read: int, how: str = "each column's name counted at each row, and each error row's reason"
) -> str:
    return (
        f"its rows' JSON text takes more than {parquet_plan.MAX_INPUT_DECODED_BYTES:,} bytes ({how}), "
        f"more than a file may, and only its first {rows_read:,} rows were read; split it into several files"
    )


def _row_too_large(size: int) -> str:
    return (
        f"row too large: it takes up to {size:,} bytes once read (its values in Arrow, in Python and "
        f"as JSON text), more than a row may ({row_costs.ROW_COST_BYTES:,}, 64 MiB of plain text); "
        "keep each row's values (text, images) under that"
    )


# -- CSV ------------------------------------------------------------------------------------------

#: One CSV data record: its row number, its cells, the reason it cannot be a row (or None), and for a
#: record refused unread the start of its bytes, shown in its error row.
_CsvEntry = tuple[int, list[str], str | None, bytes | None]


def _csv_row_error(cells: list[str], header: list[str], number: int, undecodable: bool) -> str | None:
    """Why a record cannot be a row, or None; ``undecodable``: the file has bytes that are not UTF-8."""
    if len(cells) != len(header):
        return f"malformed CSV: row {number} has {len(cells)} fields, the header has {len(header)}"
    if not undecodable:  # the common case, and a scan of every cell would double the parse time
        return None
    for column, cell in zip(header, cells, strict=True):
        if _UNDECODABLE.search(cell):
            return f"invalid UTF-8: row {number}, column {column!r}"
    return None


def _csv_reader(data: bytes) -> Iterator[list[str]]:
    """Python's ``csv`` reader over whole records (raw_records found where they end), decoded as it
    goes (bytes that are not UTF-8 kept as surrogates): never a piece of text at 4 bytes a character."""
    # The limit (128 KiB a field by default) guards against runaway memory: a record here is within
    # RECORD_BYTES already, and a long document in one cell is a row.
    csv.field_size_limit(max(csv.field_size_limit(), len(data) + 1))
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape", newline="")
    return csv.reader(stream, strict=False)


def _csv_reader_of(text: str) -> Iterator[list[str]]:
    return csv.reader(io.StringIO(text, newline=""), strict=False)


def _is_utf8(data: bytes) -> bool:
    """Whether the file is valid UTF-8, decoded a piece at a time and the text let go."""
    if data.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for start in range(0, len(data), _UTF8_PIECE_BYTES):
            decoder.decode(data[start : start + _UTF8_PIECE_BYTES])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


#: What a CSV chunk may cost in Python at once: its records' cells, the typed rows made of them and
#: their JSON text (:func:`_csv_refusal`). A file is read a chunk at a time, so a file of many short rows
#: (2M one-character rows grew a reader by 888 MiB read whole) holds one chunk's rows, not all.
CSV_CHUNK_BYTES = 32 << 20
#: What a record costs in Python beside its cells (measured: about 450 B a row of one short cell read
#: whole: its list of cells, the list pyarrow reads again, the row's dict and its JSON text), and what
#: each cell adds beside its text.
_CSV_ROW_COST, _CSV_CELL_COST = 512, 160
_UTF8_PIECE_BYTES = 1 << 20


def _csv_text(data: bytes, start: int, end: int, ascii_file: bool = False) -> int:
    """What a record's text takes as Python holds it: its bytes at their width (raw_records)."""
    return (end - start) * (1 if ascii_file else raw_records.char_width(data[start:end]))


def _csv_size(text: int, cells: int) -> int:
    """What a record's values take once read, as a row is bounded (:data:`RECORD_BYTES`)."""
    return _CSV_ROW_COST + _CSV_CELL_COST * cells + text


def _csv_refusal(data: bytes, start: int, end: int, header: list[str], number: int) -> tuple[str | None, int]:
    """Why a record cannot be read within :data:`RECORD_BYTES`, or None, and what it costs in a chunk
    (its size and its text again: the cells, and the typed rows' JSON text). Its cells are counted
    from its bytes, so a line of 50M commas is never 50M cells."""
    if end - start > RECORD_BYTES:
        return _record_too_large(f"row {number} ({end - start:,} bytes)"), 0
    text = _csv_text(data, start, end)
    size = _csv_size(text, raw_records.csv_cells_at_most(data, start, end))
    if size > RECORD_BYTES:  # it may be: its commas in quotes counted as cells too
        cells = raw_records.csv_cells(data, start, end, len(header))
        if cells > len(header):
            return (
                f"malformed CSV: row {number} has over {len(header)} fields, the header has {len(header)}",
                0,
            )
        size = _csv_size(text, cells)
        if size > RECORD_BYTES:
            return _record_too_large(f"row {number} ({end - start:,} bytes, {cells:,} fields)"), 0
    return None, size + text


def _csv_header(data: bytes) -> tuple[list[str], int] | str:
    """The header (repeats renamed; none: an empty file) and where the data records start, or why the
    file is unreadable. A byte order mark before it is no part of it."""
    start = len(BYTE_ORDER_MARK) if data.startswith(BYTE_ORDER_MARK) else 0
    for begin, end in raw_records.csv_records(data, start):
        if raw_records.is_blank(data, begin, end):
            continue
        cells = raw_records.csv_cells_at_most(data, begin, end)
        if end - begin > RECORD_BYTES or _csv_size(_csv_text(data, begin, end), cells) > RECORD_BYTES:
            return f"its header takes {end - begin:,} bytes ({cells:,} fields at most), more than a row may"
        header = next(_csv_reader(data[begin:end]))
        if any(_UNDECODABLE.search(column) for column in header):
            return "its header is not valid UTF-8"
        return _unique_names(header), end
    return [], len(data)


def _csv_entries(data: bytes, header: list[str], undecodable: bool, numbered: int) -> Iterator[_CsvEntry]:
    """The records of ``data`` (whole records, within the bound), numbered after ``numbered``; blank
    lines are skipped and not counted, as pyarrow and Ray Data's ``read_csv`` skip them."""
    reader = _csv_reader(data)
    number = numbered
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:  # the reader moves past the bad line, so the next call goes on
            number += 1
            yield number, [], f"malformed CSV: row {number}: {err}", None
            continue
        if cells:
            number += 1
            yield number, cells, _csv_row_error(cells, header, number, undecodable), None


#: Records are sized a span of about this many bytes at a time (each record alone only in a span
#: over the bound: wide or ragged ones), so that a file of short records costs a few C passes.
_CSV_SPAN_BYTES = 1 << 20


def _csv_pieces(data: bytes, start: int, header: list[str]) -> Iterator[tuple[int, int, int]]:
    """(start, end, cost in a chunk) of runs of records that can be read, and (start, end, -1) of each
    record that cannot (:func:`_csv_refusal`), in the file's order."""
    ascii_file = data.isascii()
    for begin, end in raw_records.csv_spans(data, start, _CSV_SPAN_BYTES):
        text = _csv_text(data, begin, end, ascii_file)
        lines = raw_records.line_ends(data, begin, end)  # at least its records
        cells = data.count(b",", begin, end) + lines  # at least their cells
        size = _CSV_ROW_COST * lines + _CSV_CELL_COST * cells + text
        if size <= RECORD_BYTES:  # the usual span: no record in it can be over the bound
            yield begin, end, size + text
            continue
        for first, last in raw_records.csv_records(data, begin, end):
            if not raw_records.is_blank(data, first, last):
                refusal, cost = _csv_refusal(data, first, last, header, 0)
                yield first, last, -1 if refusal else cost


#: Where a file's chunks lie: (start, end, refused) of a run of records read as one chunk, or of one
#: record that cannot be read (:func:`_csv_refusal`).
_CsvPlan = list[tuple[int, int, bool]]


def _csv_plan(data: bytes, start: int, header: list[str]) -> _CsvPlan:
    """The chunks of the data records from ``start``: at most :data:`CSV_CHUNK_BYTES` each (a record
    over that alone is a chunk of its own), each record sized from its bytes before it is read.
    Found once: both readings of the file read the same chunks."""
    plan: _CsvPlan = []
    first = last = start  # the chunk's bytes
    held = 0
    for begin, end, cost in _csv_pieces(data, start, header):
        if last > first and (cost < 0 or held + cost > CSV_CHUNK_BYTES):
            plan.append((first, last, False))
            first, held = begin, 0
        if cost < 0:
            plan.append((begin, end, True))
            first = last = end
            continue
        if last == first:
            first = begin
        last, held = end, held + cost
    if last > first:
        plan.append((first, last, False))
    return plan


def _csv_chunks(data: bytes, plan: _CsvPlan, header: list[str], utf8: bool) -> Iterator[list[_CsvEntry]]:
    """Each chunk's records, numbered; a refused record its error alone, unread. ``utf8``: the file is
    valid UTF-8 (no cell needs a look for bad bytes)."""
    number = 0  # the last record's (blank lines are none)
    for start, end, refused in plan:
        if refused:
            number += 1
            refusal, _ = _csv_refusal(data, start, end, header, number)
            yield [(number, [], refusal, data[start : min(end, start + 4 * RAW_LINE_KEPT_CHARS)])]
            continue
        entries = list(_csv_entries(data[start:end], header, not utf8, number))
        if entries and end == len(data):
            entries[-1] = _open_quote_checked(data, start, entries[-1])
        number = entries[-1][0] if entries else number
        yield entries


#: A line no file holds, put after a file's last record to see whether a quoted field is still open
#: there: a reader still in it reads the line into that field.
_END_PROBE = "\x1eraybatch: the end of the file\x1e"


def _open_quote_checked(data: bytes, start: int, last: _CsvEntry) -> _CsvEntry:
    """The file's last record (``last``, of the chunk from ``start``), with the reason it cannot be a row
    when a quoted field in it never closes: Python's ``csv`` (not strict) then reads the rest of the
    file into that field, and a stray quote at a cell's start made every later row silently part of
    one."""
    begin = start
    for first, stop in raw_records.csv_records(data, start):
        if not raw_records.is_blank(data, first, stop):
            begin = first
    text = data[begin:].decode("utf-8", "surrogateescape") + "\n" + _END_PROBE + "\n"
    *_, final = _csv_reader_of(text)
    if final == [_END_PROBE]:
        return last
    number, cells, _, raw = last
    lines = raw_records.line_ends(data, begin, len(data))
    reason = (
        f"malformed CSV: row {number} opens a quoted field that never closes, so the rest of the file "
        f"({lines:,} line{'s' * (lines != 1)}) would be in that field; close the quote, or write a quote "
        'in a cell as ""'
    )
    return number, cells, reason, raw


#: A number whose text carries more than its value: leading zeros (``02134``, ``007``: a cell that starts
#: ``\s*[+-]?0\d``), or an integer too long for a float to hold exactly (the whole cell
#: ``\s*[+-]?\d{16,}\s*``). Its column stays text, as written. Searched in a column's cells joined by
#: NUL: one search a column, not one a cell (a file 20,000 columns wide spent a third of its read on
#: those). ``\s`` and ``\d`` never match NUL, and no cell of a column pyarrow reads as numbers holds one,
#: so a match is one cell's, at its start or as the whole cell.
_LOSSY_CELL = re.compile(r"(?:\A|\x00)\s*[+-]?(?:0\d|\d{16,}\s*(?=\x00|\Z))")
_CELL_SEPARATOR = "\x00"


def _has_lossy_number_text(cells: Iterable[str]) -> bool:
    """Whether any of a numeric column's cells holds a number whose text carries more than its value."""
    return _LOSSY_CELL.search(_CELL_SEPARATOR.join(cells)) is not None


def _columns_to_keep_as_text(table: pa.Table, header: list[str], rows: list[list[str]]) -> set[str]:
    """Columns whose inferred type would change what users wrote: numbers with leading zeros or too
    many digits (zip codes, account numbers), and dates and times (their text would come back in
    another format). Ints, floats and bools whose text they hold exactly keep their type."""
    import pyarrow as pa

    keep = set()
    columns = list(zip(*rows, strict=True))  # one C pass; a wide chunk's columns are looked at one by one
    for index, field in enumerate(table.schema):
        kind = field.type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        if pa.types.is_temporal(kind) or (numeric and _has_lossy_number_text(columns[index])):
            keep.add(header[index])
    return keep


def _read_typed(buffer: bytes, header: list[str], text_columns: set[str]) -> pa.Table:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    return pa_csv.read_csv(
        io.BytesIO(buffer),
        read_options=pa_csv.ReadOptions(column_names=header),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(column_types=dict.fromkeys(text_columns, pa.string())),
    )


def _good_rows(chunk: list[_CsvEntry]) -> list[list[str]]:
    return [cells for _, cells, reason, _ in chunk if reason is None]


def _quoted(rows: list[list[str]]) -> bytes:
    """Records written out again, every field quoted, so quoting and newlines mean the same to pyarrow."""
    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buffer.getvalue().encode("utf-8", "surrogateescape")


def _chunk_types(header: list[str], rows: list[list[str]], id_column: str | None) -> dict[str, pa.DataType]:
    """Each column's type as pyarrow infers it over one chunk's records, the id and the columns whose
    inferred type would change what users wrote as text (:func:`_columns_to_keep_as_text`)."""
    import pyarrow as pa

    data = _quoted(rows)
    text_columns = set(header) & {id_column}  # the header first: a set[str], as id_column may be None
    table = _read_typed(data, header, text_columns)
    text_columns |= _columns_to_keep_as_text(table, header, rows)
    return {name: pa.string() if name in text_columns else table.schema.field(name).type for name in header}


def _file_types(header: list[str], chunk_types: Iterable[dict[str, pa.DataType]]) -> dict[str, pa.DataType]:
    """One type a column over the whole file, as pyarrow's reader widens it over all of it: a column
    of ints in one chunk and floats in another is floats; of two other types (or text in any), text.
    Each chunk's types are folded in as they come: a wide file's are never all held at once."""
    import pyarrow as pa

    seen: dict[str, set[pa.DataType]] = {name: set() for name in header}
    for types_ in chunk_types:
        for name in header:
            seen[name].add(types_[name])
    types = {}
    for name in header:
        found = seen[name] - {pa.null()}
        if len(found) > 1 and found <= {pa.int64(), pa.float64()}:
            found = {pa.float64()}
        types[name] = found.pop() if len(found) == 1 else pa.string() if found else pa.null()
    return types


def _typed_csv_rows(
    header: list[str], rows: list[list[str]], types: dict[str, pa.DataType] | None
) -> list[Row]:
    """Rows with each column's type as the whole file's (:func:`_file_types`; the id, always, as the
    text written), or, where pyarrow cannot read them so (``types`` None: it could not infer the
    file's), every column the text as written rather than failing the file."""
    import pyarrow.csv as pa_csv

    typed: list[Row] = []
    if types is not None:
        try:
            table = pa_csv.read_csv(
                io.BytesIO(_quoted(rows)),
                read_options=pa_csv.ReadOptions(column_names=header),
                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                convert_options=pa_csv.ConvertOptions(column_types=types),
            )
            typed = _table_rows(table)
        except Exception:  # noqa: BLE001 - type inference is a nicety; the rows themselves are already read
            typed = []
    if len(typed) != len(rows):
        return [dict(zip(header, cells, strict=True)) for cells in rows]
    return typed


def _csv_records(name: str, data: bytes, id_column: str | None) -> Iterator[Record]:
    """A CSV file's records, read twice over a chunk at a time (:data:`CSV_CHUNK_BYTES`): first to
    infer each column's type over the whole file, then to turn each chunk's records into rows."""
    opened = _csv_header(data)
    if isinstance(opened, str):
        yield _unreadable(name, "csv", opened)
        return
    header, start = opened
    if not header:  # an empty file: no rows
        return
    if len(header) > column_bound.MAX_FILE_COLUMNS:
        yield _unreadable(name, "csv", column_bound.too_many_columns("its header names", len(header)))
        return
    if (names := sum(map(column_bound.name_bytes, header))) > column_bound.MAX_FILE_NAME_BYTES:
        yield _unreadable(name, "csv", column_bound.names_too_long("its header has", names))
        return
    utf8 = _is_utf8(data)
    plan = _csv_plan(data, start, header)
    types: dict[str, pa.DataType] | None
    try:
        chunks = _csv_chunks(data, plan, header, utf8)
        found = (_chunk_types(header, rows, id_column) for chunk in chunks if (rows := _good_rows(chunk)))
        types = _file_types(header, found)
    except Exception:  # noqa: BLE001 - type inference is a nicety: every column stays the text written
        types = None
    header_size = sum(map(len, header))  # each name is in every row's JSON text
    for chunk in _csv_chunks(data, plan, header, utf8):
        typed = iter(_typed_csv_rows(header, rows, types) if (rows := _good_rows(chunk)) else [])
        for number, cells, reason, raw in chunk:
            source = f"{name}:{number}"
            if reason is None:
                yield _ok(source, next(typed), raw_size=header_size + sum(map(len, cells)))
            elif cells:  # the record as read, written back as one CSV line (bad bytes shown as U+FFFD)
                yield _bad(source, reason, raw=_csv_line(cells).encode("utf-8", "surrogateescape"))
            else:  # refused unread: the start of its bytes
                yield _bad(source, reason, raw=raw.rstrip(b"\r\n") if raw else None)


def _csv_line(cells: list[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(cells)
    return buffer.getvalue()


# -- any format -----------------------------------------------------------------------------------

#: The largest input file a job reads, in bytes. Ray Data reads each input file whole into one worker
#: (``read_binary_files``) and the parse needs more on top (measured on 200 MiB: a Ray worker peaked
#: at about 5x the file for JSONL; the CSV parse alone took 12x), so one huge upload could exhaust a
#: worker's memory. Split larger inputs into several files, which are also read in parallel.
MAX_INPUT_FILE_BYTES = 1 << 30


class InputFileTooLargeError(ValueError):
    """An input file is larger than a job reads (``MAX_INPUT_FILE_BYTES``); the message names it."""


def check_input_file_size(name: str, size: int, limit: int | None = None) -> None:
    """Raise :class:`InputFileTooLargeError` naming the file when it is over ``limit`` bytes
    (default: ``MAX_INPUT_FILE_BYTES``, read at each call)."""
    limit = MAX_INPUT_FILE_BYTES if limit is None else limit
    if size > limit:
        raise InputFileTooLargeError(
            f"input file {name!r} is {_size_text(size)}, over the {_size_text(limit)} one input file may "
            "have: each file is read whole into one Ray worker's memory. Split it into smaller files "
            "(JSONL and CSV by lines, Parquet by row groups)."
        )


def _size_text(size: int) -> str:
    return f"{size} bytes" if size < 1 << 20 else f"{size} bytes ({size / 2**20:.0f} MiB)"


def parse_file(
    name: str,
    data: bytes,
    input_format: InputFormat,
    binary_columns: tuple[str, ...] = (),
    *,
    id_column: str | None = None,
) -> Iterator[Record]:
    """Records of one file, one per row, in order; a file that cannot be read at all becomes one
    error record ``<name>:0``, and a bad row one error record, never an exception. A Parquet file
    with a column of a type off :mod:`.arrow_types`' allowlist cannot be read: no value of it is.

    :param binary_columns: columns whose bytes (Parquet binary, also inside a struct such as an image's
        ``{"bytes": ..., "path": ...}``) are kept exactly, as ``BYTES_DATA_URL_PREFIX`` data URLs;
        other bytes become text (UTF-8, bad bytes replaced).
    :param id_column: CSV only: this column is read as the text written (``007``, ``1e3``, ``NaN``
        and an empty cell stay as they are) while the other columns get pyarrow's inferred types.
        JSONL and Parquet carry their own types. Default: none.
    """
    if too_many := _too_many_values(data, input_format):
        yield _unreadable(name, input_format, too_many)
        return
    if input_format == "jsonl":
        records = _jsonl_records(name, data)
    elif input_format == "csv":
        records = _csv_records(name, data, id_column)
    else:
        records = _parquet_records(name, data, binary_columns)
    yield from _within_file_bound(name, input_format, records)


#: The most cells a CSV file may have, counted from its bytes (each comma a cell, quoted ones too):
#: about 4 us of one core each to read (a file 20,000 columns wide), so at most a few minutes a file,
#: as its rows are (``parquet_plan.MAX_INPUT_FILE_ROWS``).
MAX_INPUT_FILE_CELLS = 100_000_000


def _too_many_values(data: bytes, input_format: InputFormat) -> str | None:
    """Why a JSONL or CSV file has more lines or cells than a file may (each costs microseconds of
    Python: a 1 GiB file of one-character lines would have taken hours), or None; counted in C."""
    if input_format == "parquet":  # its plan bounds the rows it declares
        return None
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if input_format == "csv":  # a bare CR ends a CSV record too (not a JSONL line)
        lines += data.count(b"\r") - data.count(b"\r\n") - data.endswith(b"\r")
    if lines > parquet_plan.MAX_INPUT_FILE_ROWS:
        return (
            f"it has {lines:,} lines, more than a file may have ({parquet_plan.MAX_INPUT_FILE_ROWS:,}); "
            "split it into several files"
        )
    if input_format == "csv" and (cells := data.count(b",") + lines) > MAX_INPUT_FILE_CELLS:
        return (
            f"it has up to {cells:,} cells (its commas and lines), more than a file may have "
            f"({MAX_INPUT_FILE_CELLS:,}); split it into several files"
        )
    return None


def _within_file_bound(name: str, input_format: InputFormat, records: Iterator[Record]) -> Iterator[Record]:
    """``records`` while their text (source, row and reason) stays within what a file may carry
    (``MAX_INPUT_DECODED_BYTES``), then the file's error record: error rows count as rows do, so a file
    of one-byte bad lines (each a reason forty times its size) is bounded as one of good ones is."""
    written = 0
    whole_file = f"{name}:0"  # the file's own error record, its last: always shown
    for count, record in enumerate(records):
        written += len(record["source"] or "") + len(record["row"] or "") + len(record["error"] or "")
        if written > parquet_plan.MAX_INPUT_DECODED_BYTES and record["source"] != whole_file:
            yield _unreadable(name, input_format, _writes_past_bound(count))
            return
        yield record
