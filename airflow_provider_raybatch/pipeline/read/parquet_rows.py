"""Parquet input, read within :mod:`.parquet_plan`'s bounds after :mod:`.arrow_types` checked its
footer: a batch of rows at a time, each turned into Python a slice of rows at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import arrow_types, column_bound, parquet_plan, row_costs
from airflow_provider_raybatch.pipeline.read.arrow_rows import table_rows
from airflow_provider_raybatch.pipeline.read.records import Record, bad, ok, unreadable

if TYPE_CHECKING:
    import pyarrow as pa


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


def parquet_records(name: str, data: bytes, binary_columns: tuple[str, ...]) -> Iterator[Record]:
    """A Parquet file's records, read within :mod:`.parquet_plan`'s bounds: a batch of rows at a time
    as its plan sizes it, each turned into Python a slice of rows at a time, a slice costing at most
    ``row_costs.ROW_COST_BYTES`` once records."""
    import pyarrow as pa

    number = 0
    try:
        # Before pyarrow opens the file: a type off the allowlist may run the file's code (arrow_types).
        schema, metadata = arrow_types.checked_parquet_footer(data, parquet_plan.MAX_FOOTER_BYTES)
        if shape_refused := column_bound.schema_refusal(schema):
            yield unreadable(name, "parquet", shape_refused)
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
                    yield unreadable(name, "parquet", _decodes_past_bound(number))
                    return
                if held > row_costs.ROW_COST_BYTES:  # one row, alone over the budget
                    number += 1
                    yield bad(f"{name}:{number}", _row_too_large(held))
                    continue
                for row in table_rows(_dictionaries_decoded(table.slice(start, stop - start))):
                    number += 1
                    yield ok(f"{name}:{number}", row, binary_columns, raw_size=0)  # costed: row_costs
    except (
        arrow_types.RefusedArrowTypeError,
        arrow_types.FooterTooLongError,
        parquet_plan.ParquetBoundError,
    ) as err:
        yield unreadable(name, "parquet", str(err))
    except Exception as err:  # noqa: BLE001 - any reader failure is reported as the file's error row.
        after = f" after its row {number}" if number else ""
        yield unreadable(name, "parquet", f"{type(err).__name__}{after}: {err}")


def _decodes_past_bound(rows_read: int) -> str:
    return writes_past_bound(rows_read, "a dictionary's value and each column's name counted at each row")


def writes_past_bound(
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
