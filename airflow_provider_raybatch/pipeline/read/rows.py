"""Turn one input file's bytes into row records, each with a stable source and never a lost row.

We parse whole files ourselves (Ray Data hands us the bytes, one file per row) for two reasons
Ray's readers cannot serve: a deterministic ``<file>:<row number>`` id for inputs without an id
column, and one bad line or row becoming one error row instead of a failed job. A record is
:data:`.records.Record`; each format has its reader (:mod:`.jsonl_rows`, :mod:`.csv_rows`,
:mod:`.parquet_rows`), and what a file may cost is bounded here, whatever its format.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_provider_raybatch.pipeline.read import parquet_plan
from airflow_provider_raybatch.pipeline.read.csv_rows import csv_records
from airflow_provider_raybatch.pipeline.read.jsonl_rows import jsonl_records
from airflow_provider_raybatch.pipeline.read.parquet_rows import parquet_records, writes_past_bound
from airflow_provider_raybatch.pipeline.read.records import Record, unreadable
from airflow_provider_raybatch.shared.specs import InputFormat

#: The largest input file a job reads, in bytes. Ray Data reads each input file whole into one worker
#: (:mod:`.bounded_files`: never past this bound + 1 byte) and the parse needs more on top (measured
#: on 200 MiB: a Ray worker peaked at about 5x the file for JSONL; the CSV parse alone took 12x), so
#: one huge upload could exhaust a worker's memory. Split larger inputs into several files, which are
#: also read in parallel.
MAX_INPUT_FILE_BYTES = 1 << 30


class InputFileTooLargeError(ValueError):
    """An input file is larger than a job reads (``MAX_INPUT_FILE_BYTES``); the message names it."""


def check_input_file_size(name: str, size: int, limit: int | None = None) -> None:
    """Raise :class:`InputFileTooLargeError` naming the file when it is over ``limit`` bytes
    (default: ``MAX_INPUT_FILE_BYTES``, read at each call)."""
    limit = MAX_INPUT_FILE_BYTES if limit is None else limit
    if size > limit:
        raise InputFileTooLargeError(f"input file {name!r} is {_size_text(size)}, {_over_bound(limit)}")


def input_file_over_bound(name: str, limit: int) -> InputFileTooLargeError:
    """The error for a file found past ``limit`` as it is read (:mod:`.bounded_files`): the read
    stops one byte past the bound, so the file's whole size is not known, and it was within the
    bound on the job's start-up listing, so it grew since."""
    return InputFileTooLargeError(
        f"input file {name!r} grew after the job's start-up check: it is now {_over_bound(limit)}"
    )


def _over_bound(limit: int) -> str:
    return (
        f"over the {_size_text(limit)} one input file may have: each file is read whole into one Ray "
        "worker's memory. Split it into smaller files (JSONL and CSV by lines, Parquet by row groups)."
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
        ``{"bytes": ..., "path": ...}``) are kept exactly, as ``records.BYTES_DATA_URL_PREFIX`` data URLs;
        other bytes become text (UTF-8, bad bytes replaced).
    :param id_column: CSV only: this column is read as the text written (``007``, ``1e3``, ``NaN``
        and an empty cell stay as they are) while the other columns get pyarrow's inferred types.
        JSONL and Parquet carry their own types. Default: none.
    """
    if too_many := _too_many_values(data, input_format):
        yield unreadable(name, input_format, too_many)
        return
    if input_format == "jsonl":
        records = jsonl_records(name, data)
    elif input_format == "csv":
        records = csv_records(name, data, id_column)
    else:
        records = parquet_records(name, data, binary_columns)
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
            yield unreadable(name, input_format, writes_past_bound(count))
            return
        yield record
