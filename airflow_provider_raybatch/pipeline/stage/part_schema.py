"""The Arrow schema of staged Parquet parts: derived from every row of a part, then one per output.

Why: rows are whatever users wrote (JSONL whose ``Company`` is a string on one row and an object on
the next, an int column that turns to text half way through a file, a postprocess that adds a key
for some rows only). ``pa.Table.from_pylist(rows)`` took its columns from the first row, dropped
the others, and failed the whole job on the first value of another type. Here:

* A part's table has every column any of its rows has (missing cells are null), in order of first
  appearance.
* A column keeps its natural Arrow type when Arrow holds its values exactly (read back, they equal
  what was written; ints may widen to float beside floats, as in pandas). Otherwise — values of
  several types, objects with different keys (Arrow's struct inference would add the missing keys as
  nulls), integers past int64 and uint64 — the column is written as **JSON text**: each cell is the
  value's JSON (``"Acme"`` with its quotes, ``{"nested": 1}``), null stays null. Such a field carries
  the metadata ``raybatch.encoding = json``, and the manifest lists it under ``json_columns``. A
  nested column whose struct, counted over the part's rows, would pass a row's shape bounds
  (:func:`union_too_large`) is JSON text without Arrow building the struct first. A part whose
  columns together cost its Parquet footer more than :mod:`.footer_width` allows is refused
  (``OutputTooWideError``), counted from its top-level names before any column is built.
* At commit the parts of one output are made to agree (:func:`unify`, :func:`conform`): a column
  missing from a part is added as nulls, a null-typed column takes the output's type, int64 beside
  double becomes double, and a column whose types disagree across parts becomes JSON text in every
  part. Readers that take the schema from the first file (``pd.read_parquet(folder)``) then see every
  column of every part.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, cast

from airflow_provider_raybatch.pipeline.read import (
    arrow_types,
    column_bound,
    parquet_plan,
    raw_records,
    row_costs,
    staged_parquet,
)
from airflow_provider_raybatch.pipeline.stage import footer_width
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

if TYPE_CHECKING:
    import pyarrow as pa

#: Field metadata key (and value) of a column written as JSON text.
ENCODING_KEY = b"raybatch.encoding"
JSON_ENCODING = b"json"
#: How a part's sidecar names a JSON text column's type.
JSON_TYPE = "json"
NULL_TYPE = "null"
_WIDENING = {frozenset({"int64", "double"}): "double"}


def column_names(records: Iterable[Mapping[str, JsonValue]]) -> list[str]:
    """Every key of every record, in order of first appearance."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    return list(names)


def strict_json_value(value: JsonValue) -> JsonValue:
    """The value with NaN and +-Infinity (which JSON has no words for) as null, nested ones too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [strict_json_value(item) for item in value]
    return value


def json_text(value: JsonValue) -> str | None:
    """A cell of a JSON text column: the value's strict JSON; null stays null."""
    value = strict_json_value(value)
    return None if value is None else utf8_safe_json(json.dumps(value, ensure_ascii=False))


def utf8_safe_json(text: str) -> str:
    """JSON text with any lone surrogate (JSON's ``"\ud800"`` decodes to one) written as its escape,
    which is the same JSON: Arrow and UTF-8 files take no lone surrogates."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _same(written: JsonValue, read: JsonValue) -> bool:
    """Arrow gave back what was written: NaN equals NaN, True is not 1, 1 may come back as 1.0."""
    if isinstance(written, bool) or isinstance(read, bool):
        return type(written) is type(read) and written == read
    if isinstance(written, float) and isinstance(read, float) and math.isnan(written):
        return math.isnan(read)
    if isinstance(written, dict) or isinstance(read, dict):
        return (
            isinstance(written, dict)
            and isinstance(read, dict)
            and written.keys() == read.keys()
            and all(_same(written[key], read[key]) for key in written)
        )
    if isinstance(written, list) or isinstance(read, list):
        return (
            isinstance(written, list)
            and isinstance(read, list)
            and len(written) == len(read)
            and all(_same(a, b) for a, b in zip(written, read, strict=True))
        )
    if isinstance(written, int | float) and isinstance(read, int | float):
        return written == read
    return type(written) is type(read) and written == read


def _writable(data_type: pa.DataType) -> bool:
    """Parquet cannot store a struct without fields (``{}`` in every row)."""
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return data_type.num_fields > 0 and all(_writable(field.type) for field in data_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _writable(data_type.value_type)
    return True


def typed_array(values: list[JsonValue]) -> pa.Array | None:
    """The values as an Arrow array of their natural type, or None when Arrow cannot hold them exactly."""
    import pyarrow as pa

    candidates: list[pa.DataType | None] = [None]
    if all(isinstance(value, int) and not isinstance(value, bool) for value in values if value is not None):
        candidates.append(pa.uint64())  # integers in [2**63, 2**64)
    for data_type in candidates:
        try:
            array = pa.array(values, type=data_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            continue
        if _writable(array.type) and all(_same(a, b) for a, b in zip(values, array.to_pylist(), strict=True)):
            return array
    return None


def _json_field(name: str) -> pa.Field:
    import pyarrow as pa

    return pa.field(name, pa.string(), metadata={ENCODING_KEY: JSON_ENCODING})


def union_too_large(values: list[JsonValue]) -> bool:
    """Whether Arrow's inference of the column from ``values`` would build a struct past the bounds a
    row's shape has (:mod:`..read.column_bound`: its empty cells, columns and names), counted over the
    part's rows together.

    Each row is within them, but a part holds rows of several files: rows of 8 files, each a list of
    1,000 objects of one key of their own (17 KB), made Arrow build a struct of 8,000 fields for 8,000
    items (over 1.9 GiB) before the column fell back to JSON text anyway. ``row_shape`` walks a list at
    its root as a row's list: its items are at the depth, and in the places, a column's values are.
    """
    if not any(isinstance(value, dict | list) for value in values):
        return False
    return column_bound.row_shape(cast("JsonObject", values)).refusal is not None


def table_of(records: list[JsonObject]) -> pa.Table:
    """A part's rows as one table whose schema comes from all of them (see the module docstring); a
    column whose inferred struct would be too large (:func:`union_too_large`) is JSON text, unbuilt.

    :raises footer_width.OutputTooWideError: the part's columns together cost its footer more than
        :data:`.footer_width.MAX_FOOTER_SCHEMA_BYTES`; counted from the top-level names before any
        array is built, then as each column's type is known. Each row is within its own bounds, but a
        part holds rows of several files (or a preprocess's rows): 32 rows of 4,000 distinct
        127-character keys each took the writer 1.4 GiB for a part no commit could take.
    """
    import pyarrow as pa

    names = column_names(records)
    least = [footer_width.name_bytes(name) for name in names]
    size = footer_width.schema_bytes(()) + sum(least)
    _check_part_width(len(names), size)
    fields, arrays = [], []
    for name, name_size in zip(names, least, strict=True):
        values = [record.get(name) for record in records]
        array = None if union_too_large(values) else typed_array(values)
        if array is None:
            fields.append(_json_field(name))
            arrays.append(pa.array([json_text(value) for value in values], type=pa.string()))
        else:
            fields.append(pa.field(name, array.type))
            arrays.append(array)
        size += footer_width.field_bytes(fields[-1]) - name_size
        _check_part_width(len(names), size)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _check_part_width(columns: int, size: int) -> None:
    too_wide = footer_width.refusal(columns, size, "a part's rows")
    if too_wide is not None:
        raise too_wide


def is_json_field(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(ENCODING_KEY) == JSON_ENCODING


def column_types(table: pa.Table) -> dict[str, str]:
    """What a part's sidecar records of its table: column -> Arrow type text, or ``json``."""
    return {field.name: JSON_TYPE if is_json_field(field) else str(field.type) for field in table.schema}


def unify(part_types: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """One type per column for all parts of an output: the parts' own where they agree (null aside),
    int64 beside double as double, and JSON text where they disagree."""
    seen: dict[str, set[str]] = {}
    for types in part_types:
        for name, type_text in types.items():
            seen.setdefault(name, set()).add(type_text)
    unified = {}
    for name, type_texts in seen.items():
        concrete = frozenset(type_texts - {NULL_TYPE})
        if not concrete:
            unified[name] = NULL_TYPE
        elif len(concrete) == 1:
            (unified[name],) = concrete
        else:
            unified[name] = _WIDENING.get(concrete, JSON_TYPE)
    return unified


def conform(table: pa.Table, target: Mapping[str, str], arrow_types: Mapping[str, pa.DataType]) -> pa.Table:
    """The part's table with exactly the target's columns, in its order, of its types.

    :param arrow_types: the Arrow type of each concrete (not JSON, not null) target column, taken
        from a part that has it.
    """
    import pyarrow as pa

    fields = target_fields(target, arrow_types)
    # By position, looked up once: a lookup by name for each column is quadratic in the columns (4
    # parts of 2,500 columns of their own, 10,000 in all, took 95 s to conform, now 16 s).
    positions = {name: position for position, name in enumerate(table.column_names)}
    schema = table.schema
    arrays = []
    for field in fields:
        position = positions.get(field.name)
        column = None if position is None else table.column(position)
        if is_json_field(field):
            if position is not None and is_json_field(schema.field(position)):
                arrays.append(column)
            else:
                values = column.to_pylist() if column is not None else [None] * table.num_rows
                arrays.append(pa.array([json_text(value) for value in values], type=pa.string()))
            continue
        arrays.append(column.cast(field.type) if column is not None else pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def target_fields(target: Mapping[str, str], arrow_types: Mapping[str, pa.DataType]) -> list[pa.Field]:
    """The fields every part of an output has once conformed (:func:`conform`), in the target's order.

    :param arrow_types: as :func:`conform` takes them.
    """
    import pyarrow as pa

    return [
        _json_field(name)
        if type_text == JSON_TYPE
        else pa.field(name, pa.null() if type_text == NULL_TYPE else arrow_types[name])
        for name, type_text in target.items()
    ]


#: What the rows of one page of a part may cost once read (``row_costs``), where a column holds lists:
#: the commit's reader charges a row the whole of every page it is in (``parquet_plan``), and a row
#: may take at most ``PARQUET_HELD_BYTES`` (256 MiB) that way.
PAGE_ROWS_COST = parquet_plan.PARQUET_DECODE_BYTES // 4
#: pyarrow's own most rows a page (``max_rows_per_page``'s default).
PAGE_ROWS_MOST = 20_000


def encode_parquet(table: pa.Table) -> bytes:
    """A part's table as Parquet whose pages stay within what commit reads back
    (:mod:`..read.staged_parquet`, :mod:`..read.parquet_plan`: a page at most 64 MiB decompressed, the
    pages a row is in at most 256 MiB decoded).

    pyarrow closes a page (and falls back from a dictionary) once it passes its size, but checks only
    after each ``write_batch_size`` values, 1,024 by default: 1,024 rows of 80 KiB of text made one
    84 MB dictionary page, which commit would refuse. Checked after each value, a page holds at most
    1 MiB and one value; it costs 1.2 ms more a 1,024-row part. A part holding a value over
    :data:`SHARED_PAGE_VALUE_MOST` has one row a page, since 1 MiB and one value of up to 64 MiB (a
    row's text) is more than the commit reads back in a page.

    A page's bytes do not bound what a column of lists decodes to: 32 rows of 100,000 zeros were one
    dictionary page of 211 bytes holding 3.2 million values (486 MB once read), all charged to each of
    its rows. So where a column holds lists, a page holds only as many rows as cost
    :data:`PAGE_ROWS_COST` (one row at least: then its pages are its own), and those columns are
    written without a dictionary, which the reader charges at its longest value for each of them.
    """
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    long_valued = _long_valued_leaves(table)
    pq.write_table(
        table,
        buffer,
        write_batch_size=1,
        use_dictionary=[leaf for leaf in _flat_leaves(table.schema) if leaf not in long_valued],
        max_rows_per_page=1 if long_valued else _rows_per_page(table),
        write_statistics=_flat_leaves(table.schema, fixed_width_only=True),
    )
    return buffer.getvalue()


def has_nested_columns(schema: pa.Schema) -> bool:
    """Whether a column is a struct, a list or a map (whose nulls may cost what its widest value does)."""
    import pyarrow as pa

    return any(pa.types.is_nested(field.type) for field in schema)


def _holds_lists(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return any(_holds_lists(field.type) for field in data_type)
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type)


def _flat_leaves(schema: pa.Schema, fixed_width_only: bool = False) -> list[str]:
    """The Parquet paths of the leaf columns not inside a list or map (``a.b`` for a struct's field);
    ``fixed_width_only``: of those, the ones whose values have a fixed width (numbers, booleans, times).

    Why the second: a leaf's min and max statistics are in the footer, and a text leaf's are its values
    (up to 4 KiB each): one row of 1,500 text columns of 4 KB made a 12 MB footer, past what the commit
    reads back, so its job failed on every try. Text leaves are written without statistics.

    pyarrow takes these options by dotted path, which two leaves can share (a text column named
    ``a.b0`` beside a struct ``a`` of an int field ``b0``; one named ``x.list.element`` beside a list
    column ``x``): a path another leaf also has, or one under a list's or map's own path, is left out,
    so that an option never reaches a leaf it was not meant for.
    """
    import pyarrow as pa

    lists: set[str] = set()  # the paths of list and map columns (and fields): their leaves lie below

    def leaves(path: str, data_type: pa.DataType) -> list[tuple[str, bool]]:
        """The leaves under ``path`` outside lists and maps: dotted path, and whether it takes the option."""
        if pa.types.is_struct(data_type):
            return [leaf for field in data_type for leaf in leaves(f"{path}.{field.name}", field.type)]
        if _holds_lists(data_type):
            lists.add(path)
            return []
        return [(path, not fixed_width_only or _fixed_width(data_type))]

    def under_a_list(path: str) -> bool:
        steps = path.split(".")
        return any(".".join(steps[:end]) in lists for end in range(1, len(steps)))

    every = [leaf for field in schema for leaf in leaves(field.name, field.type)]
    shared = {path for path, count in Counter(path for path, _ in every).items() if count > 1}
    return [path for path, takes in every if takes and path not in shared and not under_a_list(path)]


#: The longest text or bytes value a part's pages may share: pyarrow checks a page's size (1 MiB)
#: only after a value went in, so a 1 MB value and then a 64 MB one made a 68 MB page (a dictionary
#: page, or a plain one), past what the commit reads back. A part holding a longer value is written
#: without a dictionary for its column and one row a page: each page holds at most one such value.
SHARED_PAGE_VALUE_MOST = 1 << 20


def _long_valued_leaves(table: pa.Table) -> set[str]:
    """The dotted paths of the text and bytes leaves (outside lists) holding a value longer than
    :data:`SHARED_PAGE_VALUE_MOST`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    while any(pa.types.is_struct(field.type) for field in table.schema):
        table = table.flatten()  # a struct's fields as columns named by their dotted paths
    return {
        name
        for name, column in zip(table.column_names, table.columns, strict=True)
        if (
            pa.types.is_string(column.type)
            or pa.types.is_large_string(column.type)
            or pa.types.is_binary(column.type)
            or pa.types.is_large_binary(column.type)
        )
        and column.null_count < len(column)
        and pc.max(pc.binary_length(column)).as_py() > SHARED_PAGE_VALUE_MOST
    }


def _fixed_width(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return not (
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_string_view(data_type)
        or pa.types.is_binary_view(data_type)
        or pa.types.is_dictionary(data_type)
        or pa.types.is_decimal(data_type)
        or pa.types.is_null(data_type)
    )


def _rows_per_page(table: pa.Table) -> int | None:
    """How many rows a page may hold so that a page of each column of lists costs at most
    :data:`PAGE_ROWS_COST` once read; None (pyarrow's default) where no column holds lists."""
    nested = [index for index, field in enumerate(table.schema) if _holds_lists(field.type)]
    if not nested or not table.num_rows:
        return None
    costliest = int(row_costs.row_costs(table.select(nested)).held.max())
    return max(1, min(PAGE_ROWS_MOST, PAGE_ROWS_COST // costliest))


def read_parquet_schema(data: bytes, name: str) -> pa.Schema:
    """A staged part's Arrow schema, once every type in it is allowed (:mod:`..read.arrow_types`) and
    its footer is no longer than a reader parses: whoever can write the output's staging folder could
    plant a part whose values run code when read, or whose footer takes gigabytes parsed.

    :param name: the part's file, as the error names it.
    :raises ValueError: a column is, or holds, a type off the allowlist, or the footer is too long;
        the message names the part and the column.
    """
    try:
        schema, _ = arrow_types.checked_parquet_footer(data, parquet_plan.MAX_FOOTER_BYTES)
    except ValueError as err:
        raise _refused(err, name) from err
    return schema


def read_parquet(data: bytes, name: str, columns: list[str] | None = None) -> pa.Table:
    """A staged part's table, read within the bounds of :mod:`..read.staged_parquet` (its types
    checked first, then its pages, then what its rows cost once read, before any value is Python).

    A part that passes no bound is refused, and the commit fails naming it, as for a part of a type
    off the allowlist or whose rows disagree with its sidecar: its sidecar makes it one of the run's
    parts, and its rows are counted in the run's totals, so skipping it as foreign would commit a
    version short of rows its manifest counts (or fail the row count anyway). The staging is kept as
    it is, for whoever can write the output to look at; no row is at fault.

    :param name: the part's file, as the error names it.
    :param columns: the columns to read, those the part has of them (None: all).
    :raises ValueError: the part cannot be read within the bounds; the message names it and the bound.
    """
    try:
        return staged_parquet.read_table(data, columns=columns)
    except ValueError as err:
        raise _refused(err, name) from err


def check_file_size(size: int, name: str) -> None:
    """Refuse a staged part's file, unread, whose bytes alone are more than its rows may cost once read
    (:data:`..read.staged_parquet.FILE_COST_BYTES`): its rows cost at least its bytes.

    :raises ValueError: the file is too large; the message names it and says what to do.
    """
    if size > staged_parquet.FILE_COST_BYTES:
        too_large = staged_parquet.StagedParquetTooLargeError(
            f"it is {size:,} bytes, more than a file read back from the staging may take once read "
            f"({staged_parquet.FILE_COST_BYTES:,})"
        )
        raise _refused(too_large, name)


def check_json_cost(texts: Iterable[bytes], name: str) -> None:
    """Refuse a staged part whose JSON texts (a JSONL part's lines, a Parquet part's JSON text cells)
    would cost more than :data:`..read.staged_parquet.FILE_COST_BYTES` once parsed, before any is:
    their text does not bound it (``[{},{},...]`` is about 80 B of Python a 3-byte ``{},``), so each
    is charged as the input reader charges a JSONL line (:func:`..read.raw_records.json_line_cost`).

    :raises ValueError: they cost too much; the message names the part and says what to do.
    """
    budget = staged_parquet.FILE_COST_BYTES
    cost = 0
    for text in texts:
        cost += raw_records.json_line_cost(text, budget - cost)
        if cost > budget:
            too_large = staged_parquet.StagedParquetTooLargeError(
                f"its JSON values take more than {budget:,} bytes once parsed ({raw_records.JSON_VALUE_COST} "
                "bytes a value, and their text), more than a file read back from the staging may"
            )
            raise _refused(too_large, name)


def _json_cells(table: pa.Table, columns: list[str]) -> Iterator[bytes]:
    """The JSON text of each cell of ``columns`` that is not null, one at a time."""
    import pyarrow as pa

    for name in columns:
        for chunk in table.column(name).chunks:
            for cell in chunk.cast(pa.binary()):
                if cell.is_valid:
                    yield cell.as_py()


#: Refusals whose type the caller may tell apart: each keeps its type, with the part named first.
_REFUSALS = (arrow_types.RefusedArrowTypeError, arrow_types.FooterTooLongError)
#: ... and those of a part too large to read back, which also say what to do.
_TOO_LARGE = (staged_parquet.StagedParquetTooLargeError, parquet_plan.ParquetBoundError)


def _refused(err: ValueError, name: str) -> ValueError:
    """The reader's refusal of a staged part, naming the part first."""
    if isinstance(err, _TOO_LARGE):
        return type(err)(
            f"staged part {name}: {err}. The commit refuses it: a part this job stages holds one engine "
            "flush of rows (batch_size // 2), so lower batch_size if your rows are this large; if the "
            "job did not write it, delete the file and a retry redoes its rows"
        )
    refusal = type(err) if isinstance(err, _REFUSALS) else ValueError
    return refusal(f"staged part {name}: {err}")


def decode_parquet(data: bytes, name: str = "part", columns: list[str] | None = None) -> list[JsonObject]:
    """A part's rows as they were staged: JSON text columns read back as the values they hold.

    :param name: the part's file, as an error names it.
    :param columns: the columns to read (None: all).
    """
    table = read_parquet(data, name, columns)
    json_columns = [field.name for field in table.schema if is_json_field(field)]
    check_json_cost(_json_cells(table, json_columns), name)
    rows = table.to_pylist()
    for row in rows:
        for name in json_columns:
            if row[name] is not None:
                row[name] = json.loads(row[name])
    return rows
