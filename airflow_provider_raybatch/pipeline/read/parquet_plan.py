"""How many rows of a Parquet file the reader decodes at a time, read from what its pages state.

What one input file makes the reader hold is bounded by a fixed budget, whatever the file claims:

* its footer is at most :data:`MAX_FOOTER_BYTES` before pyarrow parses it (pyarrow takes about 12x
  a footer's bytes to hold it parsed; ``arrow_types``), and is parsed once;
* each page, data or dictionary, decompresses to at most :data:`PARQUET_PAGE_BYTES`, and the pages
  that one row group's column readers hold at once (each column's largest page, and its
  dictionary decoded) to at most :data:`PARQUET_HELD_BYTES`;
* each batch of rows decodes to at most :data:`PARQUET_DECODE_BYTES` of values (in Arrow, and the
  Python objects and JSON text each value becomes: a nested value a dict per struct), or to what the pages
  of its first row decode to where that is more (a batch of images, each page 1,024 of them), and
  one row's pages to at most :data:`PARQUET_HELD_BYTES`; rows are turned into Python a slice of at
  most :data:`PARQUET_DECODE_BYTES` at a time, and a row whose values alone are more is its error row.

So a reader holds at most about 12x :data:`PARQUET_DECODE_BYTES` for one file (the footer parsed, the
pages held, a batch decoded, a slice in Python), however small the file is and however far its
values expand. The checks read what the decompressor and the decoder obey: each page's own header
(:mod:`.parquet_pages`: its decompressed size and its value count; the footer's totals can lie; each
chunk walked over the bytes pyarrow reads, and holding the values its footer states), a
nested column's repetition levels (the rows each page covers) and a dictionary's longest value
(:mod:`.parquet_levels`). A file that cannot be read within these bounds is that file's error row,
saying which bound and what to do (smaller pages, smaller row groups, or several files), never a
failed job and never a worker grown by gigabytes.

The bounds leave what common writers make alone: pyarrow's, DuckDB's and Spark's pages of about
1 MiB (pyarrow puts up to 1,024 values in a page, so a page of images is 1,024 images: 60 KiB images
make 60 MiB pages) and their dictionary pages (1 MiB, or the first 1,024 values).
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import arrow_types, parquet_levels, parquet_pages
from airflow_provider_raybatch.pipeline.read.parquet_pages import Page

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: The most rows a batch holds, and the most bytes its values decode to (one row's pages alone may
#: decode to more, up to :data:`PARQUET_HELD_BYTES`); also the most a row's values may be.
PARQUET_BATCH_ROWS = 1024
PARQUET_DECODE_BYTES = 64 << 20
#: The most one page (data or dictionary) may decompress to.
PARQUET_PAGE_BYTES = 64 << 20
#: The most the pages that one row group's column readers hold at once may take (each column's
#: largest page, and its dictionary decoded), and the most one row's pages may decode to.
PARQUET_HELD_BYTES = 256 << 20
#: The longest footer a file may have (``arrow_types`` checks it before pyarrow parses it).
MAX_FOOTER_BYTES = 8 << 20
#: The most a file's pages may decompress to in all, the most rows it may declare (a few bytes of
#: Parquet can declare a hundred million), and the most pages it may have (each header is read here).
MAX_INPUT_DECODED_BYTES = 4 << 30
MAX_INPUT_FILE_ROWS = 50_000_000
MAX_FILE_PAGES = 200_000
#: What a decoded value takes besides its own bytes: its offset, its levels, its validity bit.
_VALUE_OVERHEAD = 16
#: What a value costs once it is Python, beside what Arrow holds: ``to_pylist`` makes an object of
#: each and the row's JSON text holds each again. Measured through ``rows.parse_file`` (peak growth per
#: item of one row's list, Python 3.11): a bool 34 B, an int 69, a float 77, an 8-character string 108,
#: a timestamp 119 (a datetime and its ISO text), so a value is charged the most of them.
PY_VALUE_BYTES = 128
#: ... and a dict per struct value: 210 B a level of one-field structs (a dict of 184 B and its key
#: in the JSON text), charged to the struct's first leaf so a wide struct pays it once. A map's entry
#: (a tuple, 131 B with its two values) is charged as one.
PY_DICT_BYTES = 256
#: ... and a list per value of a list inside a list: 100 B an empty inner list.
PY_LIST_BYTES = 128
#: A value's own bytes, by physical type, where it has a fixed width (FIXED_LEN_BYTE_ARRAY: the column's).
_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
#: The encodings of byte-array values whose decoded bytes a page's decompressed size bounds.
_BOUNDED_BYTE_ENCODINGS = frozenset({parquet_pages.PLAIN, parquet_pages.DELTA_LENGTH_BYTE_ARRAY})
#: Dictionaries of at most this many values are looked through here for their longest value.
_FEW_DICTIONARY_VALUES = 4096
_ENCODING_NAMES = {parquet_pages.DELTA_BYTE_ARRAY: "DELTA_BYTE_ARRAY"}

_SPLIT_ADVICE = (
    "write it with smaller pages or row groups (pyarrow: write_batch_size=64, row_group_size=10_000) "
    "or split it into several files"
)


class ParquetBoundError(ValueError):
    """A Parquet file the reader cannot read within its bounds; the message names the bound and what to do."""


@dataclass(frozen=True, slots=True)
class ParquetPlan:
    """How to read a file: which columns as Arrow dictionaries, and each batch's rows in order.

    :param dictionary_columns: top-level text or bytes columns dictionary-encoded through in every
        row group: read as Arrow dictionaries, each value held once.
    :param batches: rows of each batch, in the file's order; no batch spans two row groups.
    """

    dictionary_columns: list[str]
    batches: list[int]


@dataclass(frozen=True, slots=True)
class _Leaf:
    """A leaf column as the schema states it."""

    path: str
    width: int | None  # a fixed-width value's bytes; None for byte arrays
    max_repetition_level: int  # over 0: repeated somewhere above, so a row may span many pages
    python: int  # what each of its values costs in Python (its object, the dicts and lists it opens)


@dataclass(slots=True)
class _Chunk:
    """One column chunk's pages, summed up for the bound.

    Pages whose values a batch decodes whole once it reads any of their rows are kept as
    ``[first, end)`` row ranges with a cost each (``costs`` plus ``dictionary_values`` times the
    dictionary's longest value); every row costs ``per_row`` besides.
    """

    leaf: _Leaf
    codec: str
    held: int = 0
    per_row: int = 0
    firsts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    costs: array[int] = field(default_factory=lambda: array("q"))
    dictionary_values: array[int] = field(default_factory=lambda: array("q"))
    dictionary: Page | None = None
    from_dictionary: bool = False  # some data page's values are indices into the dictionary
    only_dictionary: bool = True  # every data page's are

    def charge(self, first: int, end: int, cost: int, dictionary_values: int = 0) -> None:
        self.firsts.append(first)
        self.ends.append(end)
        self.costs.append(cost)
        self.dictionary_values.append(dictionary_values)


#: pyarrow reads up to this many bytes past each column chunk of a file written by parquet-mr 1.2.8
#: or older (``kMaxDictHeaderSize``, its PARQUET-816 workaround: that writer left the dictionary page's
#: header out of the chunk's size), so a page hidden there is decoded: the walk reads them too.
PARQUET_816_PADDING = 100
_PARQUET_MR_VERSION = re.compile(r"parquet-mr\s+version\s+(\d+)\.(\d+)\.(\d+)", re.IGNORECASE)


def _padded_chunks(created_by: str | None) -> bool:
    """Whether pyarrow reads past each chunk's end for a file its ``created_by`` says parquet-mr wrote
    before 1.2.9. A version it cannot parse counts as old: walking the padding where pyarrow does not
    only charges pages it never reads, and a walk short of the footer's values fails the file anyway."""
    if not created_by or "parquet-mr" not in created_by.lower():
        return False
    found = _PARQUET_MR_VERSION.search(created_by)
    return found is None or tuple(int(part) for part in found.groups()) < (1, 2, 9)


class _Walk:
    """The file's bytes, and what its pages add up to so far."""

    def __init__(self, data: bytes, padded: bool) -> None:
        self.data, self.padded, self.pages, self.decompressed = data, padded, 0, 0

    def pages_of(self, column: pq.ColumnChunkMetaData) -> list[Page]:
        start = column.data_page_offset
        # As pyarrow's reader: the chunk starts at its dictionary page where that comes first.
        offset = column.dictionary_page_offset if column.has_dictionary_page else None
        if offset and offset < start:
            start = offset
        length = column.total_compressed_size
        if self.padded and 0 <= start + length < len(self.data):
            length += min(PARQUET_816_PADDING, len(self.data) - (start + length))
        left = MAX_FILE_PAGES - self.pages
        pages = parquet_pages.chunk_pages(self.data, start, length, column.num_values, left)
        self.pages += len(pages)
        if self.pages > MAX_FILE_PAGES:
            raise ParquetBoundError(
                f"it has more than {MAX_FILE_PAGES:,} pages, more than a file may; "
                "split it into several files"
            )
        # pyarrow reads pages until they hold the footer's count: fewer here means its reader goes on
        # past the bytes walked (and charged), into what it reads beyond them.
        held = sum(page.values for page in pages if page.kind in _DATA_PAGES)
        if held < column.num_values:
            raise ParquetBoundError(
                f"column {column.path_in_schema!r} has a column chunk whose pages hold {held:,} values "
                f"where its footer states {column.num_values:,}; write the file again"
            )
        self.decompressed += sum(page.uncompressed for page in pages if page.kind in _READ_PAGES)
        if self.decompressed > MAX_INPUT_DECODED_BYTES:
            raise ParquetBoundError(
                f"its pages decompress to more than {MAX_INPUT_DECODED_BYTES:,} bytes, more than a file "
                "may hold; split it into several files"
            )
        return pages


_DATA_PAGES = frozenset({parquet_pages.DATA_PAGE, parquet_pages.DATA_PAGE_V2})
#: The pages pyarrow decompresses; it skips others (index pages) unread.
_READ_PAGES = _DATA_PAGES | {parquet_pages.DICTIONARY_PAGE}


def plan_reading(data: bytes, metadata: pq.FileMetaData, schema: pa.Schema) -> ParquetPlan:
    """The plan to read a file within the bounds above, from its page headers.

    :param data: the whole file.
    :param metadata: its footer, parsed (at most :data:`MAX_FOOTER_BYTES`).
    :param schema: the Arrow schema it is read with (its types already checked).
    :raises ParquetBoundError: the file cannot be read within a bound; the message says which.
    :raises ValueError: a page header cannot be read (pyarrow would fail on the file too).
    """
    if metadata.num_rows > MAX_INPUT_FILE_ROWS:
        raise ParquetBoundError(
            f"it declares {metadata.num_rows:,} rows, more than a file may hold ({MAX_INPUT_FILE_ROWS:,}); "
            "split it into several files"
        )
    python = _python_costs(schema, metadata)
    leaves = [_leaf(metadata.schema.column(index), python[index]) for index in range(metadata.num_columns)]
    walk = _Walk(data, _padded_chunks(metadata.created_by))
    groups = [
        _group_chunks(walk, metadata.row_group(group), group, leaves)
        for group in range(metadata.num_row_groups)
    ]
    dictionary_columns = _read_as_dictionaries(groups, leaves, schema)
    batches: list[int] = []
    for group, chunks in enumerate(groups):
        longest = {}
        for index, chunk in enumerate(chunks):
            if chunk.leaf.path in dictionary_columns:
                # an index; its value is held once in Arrow, in the dictionary
                chunk.per_row = 4 + _VALUE_OVERHEAD + chunk.leaf.python
            elif chunk.from_dictionary and chunk.leaf.width is None:
                longest[index] = _longest_value(data, metadata, group, chunk)
                if not chunk.leaf.max_repetition_level:
                    chunk.per_row += longest[index]  # a flat column: one value a row
        batches.extend(_batches(_Costs(chunks, longest), metadata.row_group(group).num_rows, group))
    return ParquetPlan(dictionary_columns=sorted(dictionary_columns), batches=batches)


def planned_batches(
    parquet: pq.ParquetFile, plan: ParquetPlan, fields: list[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """The file's batches, each of the rows its plan says: pyarrow's reader takes a new batch size
    before each batch. A batch of other rows than planned fails the file rather than be used.

    :param parquet: the file opened with the plan's ``dictionary_columns`` as ``read_dictionary``.
    :param fields: the top-level fields to read, by position (None: all); the plan's batches count them
        all. By position, not name: pyarrow takes a name as a dotted path, so a column ``a.b`` read
        by name also read struct ``a``'s field ``b``.
    :raises ValueError: the reader read a batch of other rows than planned.
    """
    if not plan.batches:
        return
    leaves = None if fields is None else _leaf_indices(parquet.schema_arrow, fields)
    batches = parquet.reader.iter_batches(
        plan.batches[0], row_groups=range(parquet.metadata.num_row_groups), column_indices=leaves
    )
    for rows in plan.batches:
        parquet.reader.set_batch_size(rows)
        batch = next(batches, None)
        if batch is None or batch.num_rows != rows:
            got = 0 if batch is None else batch.num_rows
            raise ValueError(f"its reader read a batch of {got:,} rows where {rows:,} were planned")
        yield batch


def _leaf_indices(schema: pa.Schema, fields: list[int]) -> list[int]:
    """The Parquet leaf columns of the top-level ``fields`` (positions in ``schema``), in the file's order:
    each field's leaves follow the fields before it's."""
    counts = [_leaf_count(field.type) for field in schema]
    starts = [sum(counts[:position]) for position in range(len(counts))]
    return [starts[position] + leaf for position in sorted(fields) for leaf in range(counts[position])]


def _leaf_count(data_type: pa.DataType) -> int:
    import pyarrow as pa

    if pa.types.is_struct(data_type):
        return sum(_leaf_count(field.type) for field in data_type)
    if pa.types.is_map(data_type):
        return _leaf_count(data_type.key_type) + _leaf_count(data_type.item_type)
    if (
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
    ):
        return _leaf_count(data_type.value_type)
    return 1


def _leaf(column: pq.ColumnSchema, python: int) -> _Leaf:
    physical = column.physical_type
    width = column.length if physical == "FIXED_LEN_BYTE_ARRAY" else _WIDTHS.get(physical)
    return _Leaf(
        path=column.path, width=width, max_repetition_level=column.max_repetition_level, python=python
    )


def _python_costs(schema: pa.Schema, metadata: pq.FileMetaData) -> list[int]:
    """What each value of each leaf column (in the file's order) costs once it is Python: the value
    itself, and the dicts and lists it is the first leaf of (a list's items each open one only inside
    another list; a row's own list is one a row). A schema whose leaves do not line up with the
    file's is charged as if each level above a leaf were a struct, and each repeated one a list too."""
    import pyarrow as pa

    costs: list[int] = []

    def walk(data_type: pa.DataType, in_list: bool, owed: int) -> None:
        if pa.types.is_struct(data_type):
            for index in range(data_type.num_fields):
                walk(data_type.field(index).type, in_list, owed + PY_DICT_BYTES if index == 0 else 0)
        elif pa.types.is_map(data_type):
            opened = owed + (PY_LIST_BYTES if in_list else 0) + PY_DICT_BYTES
            walk(data_type.key_type, True, opened)
            walk(data_type.item_type, True, 0)
        elif isinstance(data_type, pa.ListType | pa.LargeListType | pa.FixedSizeListType) or (
            pa.types.is_list_view(data_type) or pa.types.is_large_list_view(data_type)
        ):
            walk(data_type.value_type, True, owed + (PY_LIST_BYTES if in_list else 0))
        else:
            costs.append(PY_VALUE_BYTES + owed)

    for column in schema:
        walk(column.type, False, 0)
    if len(costs) == metadata.num_columns:
        return costs
    columns = [metadata.schema.column(index) for index in range(metadata.num_columns)]
    return [
        PY_VALUE_BYTES + column.path.count(".") * PY_DICT_BYTES + column.max_repetition_level * PY_LIST_BYTES
        for column in columns
    ]


def _group_chunks(
    walk: _Walk, row_group: pq.RowGroupMetaData, group: int, leaves: list[_Leaf]
) -> list[_Chunk]:
    chunks = [
        _chunk(walk, row_group.column(index), leaf, row_group.num_rows) for index, leaf in enumerate(leaves)
    ]
    held = sum(chunk.held for chunk in chunks)
    if held > PARQUET_HELD_BYTES:
        raise ParquetBoundError(
            f"its row group {group} holds pages of {held:,} bytes decompressed at once (each column's "
            f"largest page and its dictionary), more than a reader may ({PARQUET_HELD_BYTES:,}); "
            + _SPLIT_ADVICE
        )
    return chunks


def _chunk(walk: _Walk, column: pq.ColumnChunkMetaData, leaf: _Leaf, rows: int) -> _Chunk:
    chunk = _Chunk(leaf=leaf, codec=column.compression)
    data_pages = []
    largest = 0
    for page in walk.pages_of(column):
        if page.kind not in _READ_PAGES:
            continue
        # pyarrow decompresses a page to the size its header states; a page not compressed is its bytes.
        size = max(page.uncompressed, page.compressed)
        if size > PARQUET_PAGE_BYTES:
            what = "dictionary page" if page.kind == parquet_pages.DICTIONARY_PAGE else "page"
            raise ParquetBoundError(
                f"column {leaf.path!r} has a {what} of {size:,} bytes decompressed, more than a page may "
                f"({PARQUET_PAGE_BYTES:,}); " + _SPLIT_ADVICE
            )
        if page.kind == parquet_pages.DICTIONARY_PAGE:
            chunk.dictionary = page
            chunk.held += size + page.values * 8  # decoded: its bytes again, and an offset a value
            continue
        largest = max(largest, size)
        data_pages.append(page)
        from_dictionary = page.encoding in parquet_pages.DICTIONARY_ENCODINGS
        chunk.from_dictionary |= from_dictionary
        chunk.only_dictionary &= from_dictionary
        if leaf.width is None and not from_dictionary and page.encoding not in _BOUNDED_BYTE_ENCODINGS:
            name = _ENCODING_NAMES.get(page.encoding, f"encoding {page.encoding}")
            raise ParquetBoundError(
                f"column {leaf.path!r} has {name} pages, whose decoded size their pages do not bound; write "
                "it with PLAIN or dictionary encoding (pyarrow's, DuckDB's and Spark's defaults)"
            )
    chunk.held += largest  # the decompression buffer, as large as the largest page
    if leaf.max_repetition_level:
        _charge_nested(walk.data, chunk, data_pages, rows)
    elif leaf.width is not None:
        chunk.per_row = leaf.width + _VALUE_OVERHEAD + leaf.python
    else:
        chunk.per_row = _VALUE_OVERHEAD + leaf.python
        row = 0
        for page in data_pages:  # a flat column: a value a row
            if page.encoding not in parquet_pages.DICTIONARY_ENCODINGS:
                chunk.charge(row, row + page.values, page.uncompressed)
            row += page.values
    return chunk


def _charge_nested(data: bytes, chunk: _Chunk, pages: list[Page], rows: int) -> None:
    """Charge each page of a nested column for the rows it covers (read from its repetition levels),
    or, where some page's cannot be read here, every page for every row of the row group."""
    found: list[tuple[int, int]] = []
    spans: list[tuple[int, int]] | None = found
    row = 0
    for page in pages:
        started = parquet_levels.rows_started(data, page, chunk.codec, chunk.leaf.max_repetition_level)
        if started is None:
            spans = None
            break
        count, inside = started
        first = max(row - 1, 0) if inside else row  # a page that starts inside a row covers its end
        row += count
        found.append((first, max(row, first + 1)))
    each = _VALUE_OVERHEAD + chunk.leaf.python  # a value (a level: maybe an empty list) in Arrow and Python
    for index, page in enumerate(pages):
        first, end = (0, max(rows, 1)) if spans is None else spans[index]
        if chunk.leaf.width is not None:
            chunk.charge(first, end, page.values * (chunk.leaf.width + each))
        elif page.encoding in parquet_pages.DICTIONARY_ENCODINGS:
            chunk.charge(first, end, page.values * each, dictionary_values=page.values)
        else:
            chunk.charge(first, end, page.uncompressed + page.values * each)


def _read_as_dictionaries(groups: list[list[_Chunk]], leaves: list[_Leaf], schema: pa.Schema) -> set[str]:
    """Top-level text or bytes columns whose data pages are dictionary indices in every row group.

    pyarrow then reads the column as an Arrow dictionary at no cost, each value held once. A column
    with plain pages in some row group is read as plain values: as a dictionary, pyarrow would hash
    them again, and hold every distinct value of its row group.
    """
    import pyarrow as pa

    names = schema.names
    columns = set()
    for index, leaf in enumerate(leaves):
        if leaf.max_repetition_level or names.count(leaf.path) != 1:
            continue
        data_type = schema.field(leaf.path).type
        if not any(
            check(data_type)
            for check in (
                pa.types.is_string,
                pa.types.is_binary,
                pa.types.is_large_string,
                pa.types.is_large_binary,
            )
        ):
            continue
        if groups and all(chunks[index].only_dictionary and chunks[index].dictionary for chunks in groups):
            columns.add(leaf.path)
    return columns


def _longest_value(data: bytes, metadata: pq.FileMetaData, group: int, chunk: _Chunk) -> int:
    """The longest value of the chunk's dictionary, or where it cannot be read, the most it can be
    (every other value takes at least its 4-byte length)."""
    page = chunk.dictionary
    if page is None:
        return 0  # indices with no dictionary: pyarrow fails on them
    most = max(page.uncompressed - 4 * page.values, 0)
    if most <= _VALUE_OVERHEAD:
        return most
    # A few values are quicker looked through here; many, in bulk by pyarrow, which decodes the
    # dictionary with a column's first row: never a nested column's, whose row may span its row group.
    if page.values <= _FEW_DICTIONARY_VALUES or chunk.leaf.max_repetition_level:
        longest = parquet_levels.longest_dictionary_value(data, page, chunk.codec)
    else:
        longest = _longest_decoded(data, metadata, group, chunk.leaf.path)
    return most if longest is None else min(longest, most)


def _longest_decoded(data: bytes, metadata: pq.FileMetaData, group: int, column: str) -> int | None:
    """The longest value of a flat column's dictionary (maybe inside structs) in a row group, as
    pyarrow decodes it with the row group's first row (one value, at most a page)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        parquet = arrow_types.open_parquet(pa.BufferReader(data), read_dictionary=[column], metadata=metadata)
        batch = next(parquet.iter_batches(batch_size=1, row_groups=[group], columns=[column]), None)
    except Exception:  # noqa: BLE001 - e.g. a repeated column name: the bound takes the most instead
        return None
    if batch is None or batch.num_columns != 1:
        return None
    values = batch.column(0)
    while pa.types.is_struct(values.type) and values.type.num_fields == 1:  # a leaf inside structs
        values = values.field(0)
    if not pa.types.is_dictionary(values.type):
        return None
    return int(pc.max(pc.binary_length(values.dictionary)).as_py() or 0)


class _Costs:
    """What the rows ``[start, stop)`` of one row group decode to, at most."""

    def __init__(self, chunks: list[_Chunk], longest: dict[int, int]) -> None:
        self.per_row = sum(chunk.per_row for chunk in chunks)
        self.paged: list[tuple[array[int], array[int], list[int]]] = []
        for index, chunk in enumerate(chunks):
            if not chunk.firsts:
                continue
            extra = longest.get(index, 0)
            prefix = [0]
            for cost, values in zip(chunk.costs, chunk.dictionary_values, strict=True):
                prefix.append(prefix[-1] + cost + values * extra)
            self.paged.append((chunk.firsts, chunk.ends, prefix))

    def __call__(self, start: int, stop: int) -> int:
        total = self.per_row * (stop - start)
        for firsts, ends, prefix in self.paged:
            first = bisect.bisect_right(ends, start)  # the pages that end after the rows start
            last = bisect.bisect_left(firsts, stop)  # ... and begin before they stop
            if last > first:
                total += prefix[last] - prefix[first]
        return total


def _batches(costs: _Costs, rows: int, group: int) -> Iterator[int]:
    """Rows of each batch of a row group: as many as decode to :data:`PARQUET_DECODE_BYTES` (at most
    :data:`PARQUET_BATCH_ROWS`), or to what the batch's first row's pages decode to where that is more."""
    start = 0
    while start < rows:
        stop = min(start + PARQUET_BATCH_ROWS, rows)
        first = costs(start, start + 1)
        if first > PARQUET_HELD_BYTES:
            raise ParquetBoundError(
                f"row {start + 1} of its row group {group} is in pages that decode to {first:,} bytes, more "
                f"than a row may ({PARQUET_HELD_BYTES:,}); " + _SPLIT_ADVICE
            )
        most = max(PARQUET_DECODE_BYTES, first)
        if costs(start, stop) > most:
            fits, over = start + 1, stop
            while over - fits > 1:
                middle = (fits + over) // 2
                if costs(start, middle) <= most:
                    fits = middle
                else:
                    over = middle
            stop = fits
        yield stop - start
        start = stop
