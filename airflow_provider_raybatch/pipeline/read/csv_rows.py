"""CSV input, read twice over.

Python's ``csv`` module decides the structure (quoted newlines stay in their field, and it hands us
each record so a ragged one fails alone), then pyarrow reads the good records again to infer each
column's type as Ray Data's ``read_csv`` would, wherever that keeps what users wrote: the id column,
numbers with leading zeros or too many digits (``02134`` is not ``2134``), and dates and times stay the
text as written. Both read a chunk of records at a time (``CSV_CHUNK_BYTES``): the file's records are
never all Python at once, and each column's type is the one over all chunks.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import column_bound, raw_records, records
from airflow_provider_raybatch.pipeline.read.arrow_rows import table_rows, unique_names
from airflow_provider_raybatch.pipeline.read.records import RAW_LINE_KEPT_CHARS, Record, bad, ok, unreadable
from airflow_provider_raybatch.shared.json_types import Row
from airflow_provider_raybatch.shared.jsonl import BYTE_ORDER_MARK

if TYPE_CHECKING:
    import pyarrow as pa

# Bytes that are not UTF-8 decode to these under "surrogateescape", and valid UTF-8 never does,
# so a CSV row can fail for its own bad bytes while the rest of the file parses.
_UNDECODABLE = re.compile("[\udc80-\udcff]")


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
    # records.RECORD_BYTES already, and a long document in one cell is a row.
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
    """What a record's values take once read, as a row is bounded (:data:`.records.RECORD_BYTES`)."""
    return _CSV_ROW_COST + _CSV_CELL_COST * cells + text


def _csv_refusal(data: bytes, start: int, end: int, header: list[str], number: int) -> tuple[str | None, int]:
    """Why a record cannot be read within :data:`.records.RECORD_BYTES`, or None, and what it costs in a chunk
    (its size and its text again: the cells, and the typed rows' JSON text). Its cells are counted
    from its bytes, so a line of 50M commas is never 50M cells."""
    if end - start > records.RECORD_BYTES:
        return records.record_too_large(f"row {number} ({end - start:,} bytes)"), 0
    text = _csv_text(data, start, end)
    size = _csv_size(text, raw_records.csv_cells_at_most(data, start, end))
    if size > records.RECORD_BYTES:  # it may be: its commas in quotes counted as cells too
        cells = raw_records.csv_cells(data, start, end, len(header))
        if cells > len(header):
            return (
                f"malformed CSV: row {number} has over {len(header)} fields, the header has {len(header)}",
                0,
            )
        size = _csv_size(text, cells)
        if size > records.RECORD_BYTES:
            return records.record_too_large(f"row {number} ({end - start:,} bytes, {cells:,} fields)"), 0
    return None, size + text


def _csv_header(data: bytes) -> tuple[list[str], int] | str:
    """The header (repeats renamed; none: an empty file) and where the data records start, or why the
    file is unreadable. A byte order mark before it is no part of it."""
    start = len(BYTE_ORDER_MARK) if data.startswith(BYTE_ORDER_MARK) else 0
    for begin, end in raw_records.csv_records(data, start):
        if raw_records.is_blank(data, begin, end):
            continue
        cells = raw_records.csv_cells_at_most(data, begin, end)
        size = _csv_size(_csv_text(data, begin, end), cells)
        if end - begin > records.RECORD_BYTES or size > records.RECORD_BYTES:
            return f"its header takes {end - begin:,} bytes ({cells:,} fields at most), more than a row may"
        header = next(_csv_reader(data[begin:end]))
        if any(_UNDECODABLE.search(column) for column in header):
            return "its header is not valid UTF-8"
        return unique_names(header), end
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
        if size <= records.RECORD_BYTES:  # the usual span: no record in it can be over the bound
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
            typed = table_rows(table)
        except Exception:  # noqa: BLE001 - type inference is a nicety; the rows themselves are already read
            typed = []
    if len(typed) != len(rows):
        return [dict(zip(header, cells, strict=True)) for cells in rows]
    return typed


def csv_records(name: str, data: bytes, id_column: str | None) -> Iterator[Record]:
    """A CSV file's records, read twice over a chunk at a time (:data:`CSV_CHUNK_BYTES`): first to
    infer each column's type over the whole file, then to turn each chunk's records into rows."""
    opened = _csv_header(data)
    if isinstance(opened, str):
        yield unreadable(name, "csv", opened)
        return
    header, start = opened
    if not header:  # an empty file: no rows
        return
    if len(header) > column_bound.MAX_FILE_COLUMNS:
        yield unreadable(name, "csv", column_bound.too_many_columns("its header names", len(header)))
        return
    if (names := sum(map(column_bound.name_bytes, header))) > column_bound.MAX_FILE_NAME_BYTES:
        yield unreadable(name, "csv", column_bound.names_too_long("its header has", names))
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
                yield ok(source, next(typed), raw_size=header_size + sum(map(len, cells)))
            elif cells:  # the record as read, written back as one CSV line (bad bytes shown as U+FFFD)
                yield bad(source, reason, raw=_csv_line(cells).encode("utf-8", "surrogateescape"))
            else:  # refused unread: the start of its bytes
                yield bad(source, reason, raw=raw.rstrip(b"\r\n") if raw else None)


def _csv_line(cells: list[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(cells)
    return buffer.getvalue()
