"""Parquet files the job reads back from a run's staging (staged parts, a try's prepared rows), read
within a bound on what their rows decode to, before any value is made Python.

Why: the staging is in the output, which whoever can write the output can write too
(docs/security.md), and a file's bytes do not bound what it decodes to: 1.5 KB of Parquet whose 32
rows each name one 32 MiB dictionary value is 1 GiB of text once its rows are Python, and commit
holds a part's rows all at once. So such a file is read as the input reader reads one
(:mod:`.parquet_plan`: its footer and every page header checked before a value is decoded, a batch
of rows at a time, each dictionary-encoded text column held once as an Arrow dictionary), and each
batch is charged what its rows cost once they are Arrow, Python and JSON text (:mod:`.row_costs`: a
dictionary's value counted at each row that uses it) before the next batch is read. A file whose rows
cost more than :data:`FILE_COST_BYTES` is refused, holding at most a batch or so when it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import arrow_types, parquet_plan, raw_records, row_costs

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: The most a file's rows may cost once read back whole (in Arrow, in Python and as JSON text). A part
#: the job stages is one engine flush (``batch_size // 2`` rows) or one Ray Data block of rows
#: rejected before the engine, and its writer held its rows as JSON text, as Python and as Arrow at
#: once to write it: ordinary parts cost megabytes.
FILE_COST_BYTES = 16 * parquet_plan.PARQUET_DECODE_BYTES


#: What a staged row's value costs once read back from a part (:func:`.row_costs.row_costs`: in Arrow,
#: in Python and as JSON text) for each byte the input reader charges its JSON text
#: (:func:`.raw_records.json_line_cost`: :data:`.raw_records.JSON_VALUE_COST` a value, and its text at
#: its width), at most: a number in a list, in a row with a character past U+FFFF, is 152 B in Arrow
#: and Python and 101 JSON characters of 4 bytes (556 B), charged 128 B and a character or two (about
#: 136 B) by the reader, 4.1x; a string at most 3x.
READ_BACK_PER_JSON_BYTE = 5
#: What the reader would charge a value that is not text (a number, or an item of a list): a value and
#: the longest number's text (25 characters) at 4 bytes each.
_OTHER_VALUE_JSON_BYTES = 128 + 4 * 25


def staged_row_cost(row: Mapping[str, object]) -> int:
    """At most what a part's row made of ``row``'s values costs once read back (row_costs), before the
    row is staged: each text value taken as JSON text (the input row's; plain text is charged as JSON
    would be, more than it costs), charged as the input reader charges it at the row's widest
    character, times :data:`READ_BACK_PER_JSON_BYTE`; a value that is not text as one value, or one an
    item where it is a list. Cheap: a count of a few bytes in each text, nothing parsed.

    A part's rows become one table, where a row's missing columns are null cells: the caller leaves
    room for them under :data:`FILE_COST_BYTES`.
    """
    texts = []
    others = 0
    for value in row.values():
        if isinstance(value, str):
            texts.append(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bytes):
            texts.append(value)
        elif isinstance(value, Sized):
            others += max(len(value), 1)
        else:
            others += 1
    width = max((raw_records.char_width(text, json_escapes=True) for text in texts), default=1)
    charged = sum(width * len(text) + raw_records.JSON_VALUE_COST * _json_values(text) for text in texts)
    return READ_BACK_PER_JSON_BYTE * (charged + others * _OTHER_VALUE_JSON_BYTES)


def _json_values(text: bytes) -> int:
    """At least the values a JSON text holds, as the input reader counts them: each but the first
    follows a ``,``, ``:`` or ``[``, and ``{`` counts each object."""
    return sum(text.count(mark) for mark in (b",", b":", b"[", b"{")) + 1


class StagedParquetTooLargeError(ValueError):
    """A staged Parquet file whose rows cost more than a reader may hold; the message says how much."""


def read_table(data: bytes, most_cost: int | None = None, columns: list[str] | None = None) -> pa.Table:
    """The whole file, of the column types it declares (as ``pq.read_table`` gives it), once its rows
    are known to cost at most ``most_cost`` (default :data:`FILE_COST_BYTES`).

    :param columns: the top-level columns to read and charge, those the file has of them (None: all).

    :raises arrow_types.RefusedArrowTypeError: a column is, or holds, a type off the allowlist.
    :raises arrow_types.FooterTooLongError: its footer is longer than a reader parses.
    :raises parquet_plan.ParquetBoundError: a page, a row or the file passes a bound of the input reader.
    :raises StagedParquetTooLargeError: its rows cost more than ``most_cost``.
    :raises ValueError: the file cannot be read (pyarrow's own errors too).
    """
    import pyarrow as pa

    schema, metadata, plan = _planned(data)
    most_cost = FILE_COST_BYTES if most_cost is None else most_cost
    fields = None
    if columns is not None:
        fields = [position for position, name in enumerate(schema.names) if name in set(columns)]
        schema = pa.schema([schema.field(position) for position in fields], metadata=schema.metadata)
    # Charged a batch at a time first, keeping none: a file refused has held one batch, not every
    # batch read before it passed the bound. Reading twice costs little: commit reads a part only to
    # give it the output's schema or to stage its rows again without repeats.
    _charge(_batches(data, metadata, plan, fields), metadata.num_rows, most_cost)
    batches = list(_batches(data, metadata, plan, fields))
    if not batches:
        return schema.empty_table()
    table = pa.Table.from_batches(batches)
    # Dictionary columns back to the types the file declares: their values at each row now, which
    # the cost counted already. Those alone: a cast of the whole table breaks a list of nulls.
    for name in plan.dictionary_columns:
        if name not in schema.names:
            continue
        index = table.schema.get_field_index(name)
        declared = schema.field(name)
        table = table.set_column(index, declared, table.column(index).cast(declared.type))
    return table


def check_cost(data: bytes, most_cost: int | None = None) -> None:
    """Read the file a batch at a time, keeping none, and raise as :func:`read_table` does."""
    _, metadata, plan = _planned(data)
    most_cost = FILE_COST_BYTES if most_cost is None else most_cost
    _charge(_batches(data, metadata, plan), metadata.num_rows, most_cost)


def _planned(data: bytes) -> tuple[pa.Schema, pq.FileMetaData, parquet_plan.ParquetPlan]:
    """The file's checked schema and footer, and its plan (each page header read, no value decoded)."""
    schema, metadata = arrow_types.checked_parquet_footer(data, parquet_plan.MAX_FOOTER_BYTES)
    return schema, metadata, parquet_plan.plan_reading(data, metadata, schema)


def _batches(
    data: bytes, metadata: pq.FileMetaData, plan: parquet_plan.ParquetPlan, fields: list[int] | None = None
) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    # A BufferReader: pyarrow reads the pages in place, where a Python file would copy them.
    parquet = arrow_types.open_parquet(
        pa.BufferReader(data), read_dictionary=plan.dictionary_columns, metadata=metadata
    )
    return parquet_plan.planned_batches(parquet, plan, fields)


def _charge(batches: Iterator[pa.RecordBatch], file_rows: int, most_cost: int) -> None:
    import pyarrow as pa

    cost, rows = 0, 0
    for batch in batches:
        cost += int(row_costs.row_costs(pa.Table.from_batches([batch])).held.sum())
        rows += batch.num_rows
        if cost > most_cost:
            raise StagedParquetTooLargeError(
                f"its first {rows:,} of {file_rows:,} rows take more than {most_cost:,} bytes once read "
                "(in Arrow, in Python and as JSON text; a dictionary's value counted at each row that "
                "uses it), more than a file read back from the staging may"
            )
