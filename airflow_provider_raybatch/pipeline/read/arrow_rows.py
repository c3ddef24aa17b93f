"""An Arrow table's rows as Python values (Parquet input, and CSV after type inference): every cell a
value, or its text where Python cannot hold it, never a lost row or column."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.json_types import CellValue, Row

if TYPE_CHECKING:
    import pyarrow as pa


def unique_names(names: list[str]) -> list[str]:
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


def table_rows(table: pa.Table) -> list[Row]:
    names = unique_names(table.column_names)
    if not names:  # a Parquet file may have rows and no columns: each row is still a row
        return [{} for _ in range(table.num_rows)]
    columns = [_column_values(column) for column in table.columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
