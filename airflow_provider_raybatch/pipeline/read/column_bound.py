"""How many columns one input file's rows may name, each row and all of them together.

Each key of a row becomes a column of the output unless ``keep_columns`` picks some, and each key of a
nested object a field of a struct column: a staged part costs about 7 KiB a column for its rows (a
JSONL line of 150,000 keys, 1.9 MiB, made a part that took 1 GiB to write), the commit gives every
part the columns of all (rows of 20 keys of their own each made it quadratic), and a part whose
footer names 60,000 nested fields is refused when the commit reads it back, failing the job for one
row. So a file's rows may name :data:`MAX_FILE_COLUMNS` columns, a nested object's keys counted by
their path, in lists too; a JSONL row past it is its error row, a CSV header or Parquet schema the
file's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject

if TYPE_CHECKING:
    import pyarrow as pa

#: The most columns a file's rows may name together, nested fields counted.
MAX_FILE_COLUMNS = 4096

#: A column: a row's key, or a nested object's key by the path of keys to it.
Column = str | tuple[str, ...]


def too_many_columns(what: str, count: int) -> str:
    """The reason a row or file names too many columns: ``what`` then ``count`` columns."""
    return (
        f"too many columns: {what} {count:,} columns, more than a file's rows may name together "
        f"({MAX_FILE_COLUMNS:,}, a nested object's keys counted: each becomes a column of the output); "
        "split the file's rows by the columns they have, or put what varies in one column of JSON"
    )


class FileColumns:
    """The columns a file's rows have named so far."""

    def __init__(self) -> None:
        self._named: set[Column] = set()

    def refusal(self, row: JsonObject) -> str | None:
        """Why ``row`` cannot be read with the file's rows so far, or None (its columns then join them)."""
        nested = any(isinstance(value, dict | list) for value in row.values())
        if not nested and self._named.issuperset(row):  # the usual row: the columns of the rows before
            return None
        named = _columns_of(row, MAX_FILE_COLUMNS) if nested else set(row)
        if len(named) > MAX_FILE_COLUMNS:
            return too_many_columns("its row alone has at least", len(named))
        new = named - self._named
        if len(self._named) + len(new) > MAX_FILE_COLUMNS:
            return too_many_columns("with this row, the file's rows would name", len(self._named) + len(new))
        self._named |= new
        return None


def _columns_of(row: JsonObject, most: int) -> set[Column]:
    """The row's keys and each nested object's key by its path (objects in lists too), until there are
    more than ``most``."""
    named: set[Column] = set()
    pending: list[tuple[tuple[str, ...], CellValue]] = [((), row)]
    while pending and len(named) <= most:
        path, value = pending.pop()
        if isinstance(value, list):
            pending.extend((path, item) for item in value if isinstance(item, dict | list))
            continue
        if not isinstance(value, dict):
            continue
        for key, item in value.items():
            column = (*path, str(key))
            named.add(column if path else str(key))
            if isinstance(item, dict | list):
                pending.append((column, item))
    return named


def schema_columns(schema: pa.Schema, most: int = MAX_FILE_COLUMNS) -> int:
    """The columns of a Parquet file's schema, each struct's fields counted (in lists and maps too), or
    a number over ``most`` once past it."""
    import pyarrow as pa

    count = len(schema)
    pending = [field.type for field in schema]
    while pending and count <= most:
        kind = pending.pop()
        children = [kind.field(index) for index in range(kind.num_fields)]
        if pa.types.is_struct(kind):
            count += len(children)
        pending.extend(child.type for child in children)
    return count
