"""The shape one input file's rows may have: how many columns they name, how long the names are, how
deep their values nest, and how many empty cells their lists of objects make.

Each key of a row becomes a column of the output unless ``keep_columns`` picks some, and each key of a
nested object a field of a struct column; the replica writes a part from its rows (Arrow infers each
column's type from all of them) and the commit reads every part back. One row's shape alone could fail
the job there, or grow the replica by gigabytes:

* Columns: a staged part costs about 7 KiB a column for its rows (a JSONL line of 150,000 keys,
  1.9 MiB, made a part that took 1 GiB to write), the commit gives every part the columns of all (rows
  of 20 keys of their own each made it quadratic), and a part whose footer names 60,000 nested fields
  is refused when the commit reads it back. So a file's rows may name :data:`MAX_FILE_COLUMNS`
  columns, a nested object's keys counted by their path, in lists too.
* Names: each name is written three times or more in a part's footer (the Parquet schema, Arrow's
  schema, each column chunk's path), which the commit reads at most 8 MiB of: one row of 100 keys of
  40,000 characters made a 13 MB footer. So a file's rows may name :data:`MAX_FILE_NAME_BYTES` of
  names, a nested column's path counted whole.
* Depth: Parquet readers take a schema at most 100 levels deep, a list two levels and an object one,
  and pyarrow's inference grows with the square of the depth: a ~250-byte row of lists of objects 34
  deep made a part nothing could read (every retry failed alike), 300 deep grew the writer by
  568 MiB. So values may nest :data:`MAX_NESTING_DEPTH` lists and objects deep (64 levels at most).
* Empty cells: Arrow gives each object of a list every key any object at its place has, so a list of
  4,090 objects of one key each of their own (67 KB) made a struct of 4,090 fields for 4,090 items,
  +670 MiB in the writer. So a row's objects may leave :data:`MAX_ROW_EMPTY_CELLS` cells empty.

A JSONL row past a bound is its error row (and the row a preprocess returns, its row's error); a CSV
header or a Parquet schema past one the file's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject

if TYPE_CHECKING:
    import pyarrow as pa

#: The most columns a file's rows may name together, nested fields counted.
MAX_FILE_COLUMNS = 4096
#: The most bytes (UTF-8) of column names a file's rows may name together, each nested column by its
#: whole path: a part's footer holds them about four times, and the commit reads 8 MiB of footer.
MAX_FILE_NAME_BYTES = 512 * 1024
#: The most lists and objects a value may nest in (a column's value is 1 deep if it is a list or an
#: object): a list is two Parquet schema levels, an object one, and readers take 100.
MAX_NESTING_DEPTH = 32
#: The most cells a row's objects may leave empty once Arrow gives each object every key any object
#: at its place has (about 25-50 bytes of the writer's memory each).
MAX_ROW_EMPTY_CELLS = 1 << 20

#: A column: a row's key, or a nested object's key by the path of keys to it.
Column = str | tuple[str, ...]


def too_many_columns(what: str, count: int) -> str:
    """The reason a row or file names too many columns: ``what`` then ``count`` columns."""
    return (
        f"too many columns: {what} {count:,} columns, more than a file's rows may name together "
        f"({MAX_FILE_COLUMNS:,}, a nested object's keys counted: each becomes a column of the output); "
        "split the file's rows by the columns they have, or put what varies in one column of JSON"
    )


def names_too_long(what: str, size: int) -> str:
    """The reason a row or file names columns too long together: ``what`` then ``size`` bytes."""
    return (
        f"column names too long: {what} {size:,} bytes of column names (a nested column's by its whole "
        f"path), more than a file's rows may name together ({MAX_FILE_NAME_BYTES:,} bytes: each name is "
        "written in the output's Parquet footer, which readers take 8 MiB of); use shorter keys, or put "
        "what varies in one column of JSON"
    )


def too_deep(what: str) -> str:
    """The reason a row or schema nests too deep: ``what`` then how deep."""
    return (
        f"too deeply nested: {what} more than {MAX_NESTING_DEPTH} lists and objects deep, more than a "
        "value may (the output's Parquet schema would be deeper than its readers take); put such a value "
        "in one column as JSON text"
    )


def too_many_empty_cells(empty: int) -> str:
    """The reason a row's lists of objects would make too many empty cells."""
    return (
        f"too many empty cells: its objects would leave {empty:,} cells empty once each object of a list "
        "takes every key any object at its place has (as Arrow and Parquet store them), more than a row "
        f"may ({MAX_ROW_EMPTY_CELLS:,}); give the objects of a list the same keys, or put such a list in "
        "one column as JSON text"
    )


def name_bytes(column: Column) -> int:
    """The bytes a column's name (a nested one's whole path) takes in UTF-8, a lone surrogate as its
    escape (as the output writes it)."""
    names = (column,) if isinstance(column, str) else column
    return sum(len(name.encode("utf-8", "backslashreplace")) for name in names)


class FileColumns:
    """The columns a file's rows have named so far, and their names' bytes."""

    def __init__(self) -> None:
        self._named: set[Column] = set()
        self._name_bytes = 0

    def refusal(self, row: JsonObject) -> str | None:
        """Why ``row`` cannot be read with the file's rows so far, or None (its columns then join them)."""
        nested = any(isinstance(value, dict | list) for value in row.values())
        if not nested and self._named.issuperset(row):  # the usual row: the columns of the rows before
            return None
        if nested:
            shape = row_shape(row)
            if shape.refusal is not None:
                return shape.refusal
            named = shape.columns
        else:
            named = {str(key) for key in row}
            if len(named) > MAX_FILE_COLUMNS:
                return too_many_columns("its row alone has at least", len(named))
        new = named - self._named
        if len(self._named) + len(new) > MAX_FILE_COLUMNS:
            return too_many_columns("with this row, the file's rows would name", len(self._named) + len(new))
        size = self._name_bytes + sum(map(name_bytes, new))
        if size > MAX_FILE_NAME_BYTES:
            return names_too_long("with this row, the file's rows would name", size)
        self._named |= new
        self._name_bytes = size
        return None


def row_refusal(row: JsonObject) -> str | None:
    """Why ``row`` alone has a shape no row may have (:func:`row_shape`), or None."""
    return row_shape(row).refusal


@dataclass
class RowShape:
    """What :func:`row_shape` found: the row's columns, and why it is refused (None: it is not)."""

    columns: set[Column] = field(default_factory=set)
    refusal: str | None = None


class _Place:
    """One place of a row, as Arrow types it (a path of keys, and a step for each list it is in): the
    objects and lists found there, which Arrow gathers into one array."""

    __slots__ = ("children", "column", "items", "keys", "length", "parent", "values")

    def __init__(self, column: tuple[str, ...], parent: _Place | None = None) -> None:
        self.column = column  # its path of keys: the column its objects' keys are fields of
        self.parent = parent
        self.keys: set[str] = set()  # every key of an object there
        self.values = 0  # the values its objects have (their cells that are not empty)
        self.items = 0  # the items of its lists (the length of their items' array)
        self.children: dict[str | None, _Place] = {}  # by key; None: its lists' items
        self.length = 1  # the length of its array, once the whole row is walked (_empty_cells)

    def child(self, key: str | None, made: list[_Place]) -> _Place:
        """The place of its objects' ``key``, or of its lists' items (None), made on first use."""
        place = self.children.get(key)
        if place is None:
            column = self.column if key is None else (*self.column, key)
            place = self.children[key] = _Place(column, self)
            made.append(place)
        return place


def row_shape(row: JsonObject) -> RowShape:
    """The row's columns (its keys, and each nested object's key by its path, in lists too), and the
    first bound of this module it passes, if any; the walk stops at the first it finds."""
    shape = RowShape()
    root = _Place(())
    places = [root]  # each after its parent
    pending: list[tuple[_Place, CellValue, int]] = [(root, row, 0)]
    while pending:
        place, value, depth = pending.pop()
        if depth > MAX_NESTING_DEPTH:
            shape.refusal = too_deep("its values nest")
            return shape
        if isinstance(value, list):
            place.items += len(value)
            if nested := [item for item in value if isinstance(item, dict | list)]:
                items = place.child(None, places)
                pending.extend((items, item, depth + 1) for item in nested)
            continue
        if not isinstance(value, dict):
            continue
        place.values += len(value)
        for key, item in value.items():
            name = str(key)
            if name not in place.keys:
                place.keys.add(name)
                shape.columns.add((*place.column, name) if place.column else name)
                if len(shape.columns) > MAX_FILE_COLUMNS:
                    shape.refusal = too_many_columns("its row alone has at least", len(shape.columns))
                    return shape
            if isinstance(item, dict | list):
                pending.append((place.child(name, places), item, depth + 1))
    if (size := sum(map(name_bytes, shape.columns))) > MAX_FILE_NAME_BYTES:
        shape.refusal = names_too_long("its row alone has", size)
    elif (empty := _empty_cells(places)) > MAX_ROW_EMPTY_CELLS:
        shape.refusal = too_many_empty_cells(empty)
    return shape


def _empty_cells(places: list[_Place]) -> int:
    """The cells the row's objects leave empty, once each object array has a cell for each of its keys
    at each of its slots: an array's length is its lists' items' at a list's place, else its parent's
    (a struct's fields are as long as it is). ``places``: each after its parent."""
    empty = 0
    for place in places:
        if (parent := place.parent) is not None:
            place.length = parent.items if parent.children.get(None) is place else parent.length
        empty += place.length * len(place.keys) - place.values
    return empty


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


def schema_refusal(schema: pa.Schema) -> str | None:
    """Why a Parquet file's schema has a shape no file's rows may have (too many columns, names too
    long, nested too deep), or None."""
    import pyarrow as pa

    if (columns := schema_columns(schema)) > MAX_FILE_COLUMNS:
        return too_many_columns("its schema has", columns)
    size = 0
    pending: list[tuple[tuple[str, ...], pa.DataType, int]] = [((f.name,), f.type, 1) for f in schema]
    for path, _, _ in pending:
        size += name_bytes(path)
    while pending:
        path, kind, depth = pending.pop()
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if kind.num_fields == 0:
            continue
        if depth > MAX_NESTING_DEPTH:
            return too_deep("its schema's columns nest")
        if pa.types.is_struct(kind):
            for child in (kind.field(index) for index in range(kind.num_fields)):
                size += name_bytes((*path, child.name))
                pending.append(((*path, child.name), child.type, depth + 1))
        else:  # a list's items; a map's entries (its rows' values are lists of pairs, each one deeper)
            pending.extend((path, kind.field(index).type, depth + 1) for index in range(kind.num_fields))
    if size > MAX_FILE_NAME_BYTES:
        return names_too_long("its schema has", size)
    return None
