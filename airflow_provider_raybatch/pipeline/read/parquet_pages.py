"""The page headers of a Parquet column chunk, read as the decoder reads them.

A Parquet file's footer states each column chunk's sizes, and nothing makes them true: pyarrow
decompresses each page to the size its own page header states and decodes the number of values
that header states. So what a file can make a reader hold is read from the page headers
(:func:`chunk_pages`), walked the way pyarrow's page reader walks them: from the chunk's first page,
one header then its page's bytes, until the chunk's values are all seen or its bytes end.

Each header is a Thrift struct (compact protocol). Only the few fields a bound needs are kept;
every other field is skipped by its type, as Thrift's generated code does, and a field of the
wrong type is skipped too (it stays unset, so a required one missing fails the file, as in
pyarrow). The reader is bounded: a header's nesting, its containers and its strings are limited,
and so is the number of pages a file may have.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

#: Page types (parquet.thrift ``PageType``).
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
#: Encodings (parquet.thrift ``Encoding``) a bound looks at.
PLAIN, PLAIN_DICTIONARY, RLE, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY, RLE_DICTIONARY = 0, 2, 3, 6, 7, 8
DICTIONARY_ENCODINGS = frozenset({PLAIN_DICTIONARY, RLE_DICTIONARY})

#: The largest page header pyarrow reads (``kDefaultMaxPageHeaderSize``): statistics may make one
#: long, and a longer one fails pyarrow's read too.
MAX_HEADER_BYTES = 16 << 20
#: Nesting of Thrift structs, lists and maps in a header: PageHeader > DataPageHeader > Statistics is 3.
_MAX_DEPTH = 8

# Thrift compact protocol's type ids.
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)


class PageHeaderError(ValueError):
    """A page header that cannot be read; pyarrow would fail on the file too."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page as its header states it.

    :param kind: the page type (``DATA_PAGE``, ``DICTIONARY_PAGE``, ``DATA_PAGE_V2``, ...).
    :param body: where the page's (compressed) bytes start in the file.
    :param compressed: the page's bytes in the file.
    :param uncompressed: what the decompressor makes of them.
    :param values: values (levels, for a nested column) the page holds.
    :param encoding: its values' encoding.
    :param levels_bytes: a V2 data page: its repetition levels' bytes (not compressed), first in its body.
    :param level_encoding: a V1 data page: its repetition levels' encoding (``RLE``, or the old
        ``BIT_PACKED``).
    """

    kind: int
    body: int
    compressed: int
    uncompressed: int
    values: int
    encoding: int
    levels_bytes: int = 0
    level_encoding: int = RLE


class _Reader:
    """Thrift compact protocol over a bytes buffer, from ``position`` up to ``end``."""

    def __init__(self, data: bytes | memoryview, position: int, end: int) -> None:
        self.data, self.position, self.end = data, position, end

    def byte(self) -> int:
        if self.position >= self.end:
            raise PageHeaderError("a page header runs past its column chunk")
        value = self.data[self.position]
        self.position += 1
        return value

    def varint(self, most_bytes: int) -> int:
        value, shift = 0, 0
        for _ in range(most_bytes):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        raise PageHeaderError("a page header holds a variable-length int over its size")

    def i32(self) -> int:
        raw = self.varint(5) & 0xFFFFFFFF
        value = (raw >> 1) ^ -(raw & 1)  # zigzag
        return value - (1 << 32) if value >= 1 << 31 else value

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise PageHeaderError("a page header nests too deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32):
            self.varint(5)
        elif kind == _I64:
            self.varint(10)
        elif kind == _DOUBLE:
            self._advance(8)
        elif kind == _BINARY:
            self._advance(self.varint(5))
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint(5)
            self._skip_items(size, (element,), depth)
        elif kind == _MAP:
            size = self.varint(5)
            if size:
                types = self.byte()
                self._skip_items(size, (types >> 4, types & 0x0F), depth)
        elif kind == _STRUCT:
            for _, field_kind in self.fields():
                self.skip(field_kind, depth + 1)
        else:
            raise PageHeaderError(f"a page header holds an unknown Thrift type {kind}")

    def _skip_items(self, size: int, kinds: tuple[int, ...], depth: int) -> None:
        # An item takes at least a byte (a bool in a list does), so a count past the bytes left is a lie.
        if size > self.end - self.position:
            raise PageHeaderError("a page header's list is longer than its bytes")
        for _ in range(size):
            for kind in kinds:
                self.skip(_BYTE if kind in (_TRUE, _FALSE) else kind, depth + 1)

    def _advance(self, count: int) -> None:
        if count > self.end - self.position:
            raise PageHeaderError("a page header runs past its column chunk")
        self.position += count

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of a struct, up to its stop; the caller reads or skips each."""
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == _STOP:
                return
            delta = head >> 4
            if delta:
                last += delta
            else:
                raw = self.varint(3)
                last = (raw >> 1) ^ -(raw & 1)
            yield last, kind


def _struct_i32s(reader: _Reader, wanted: frozenset[int], depth: int) -> dict[int, int]:
    """The i32 fields ``wanted`` of the struct at the reader's position (the last of a repeated one);
    every other field skipped."""
    found: dict[int, int] = {}
    for field, kind in reader.fields():
        if field in wanted and kind == _I32:
            found[field] = reader.i32()
        else:
            reader.skip(kind, depth + 1)
    return found


# Field ids: PageHeader's, then the i32 fields of its page type's own header that a bound reads.
_TYPE, _UNCOMPRESSED, _COMPRESSED = 1, 2, 3
_DATA_HEADER, _DICTIONARY_HEADER, _DATA_HEADER_V2 = 5, 7, 8
_V1_FIELDS = frozenset({1, 2, 4})  # num_values, encoding, repetition_level_encoding
_DICTIONARY_FIELDS = frozenset({1, 2})  # num_values, encoding
_V2_FIELDS = frozenset({1, 4, 6})  # num_values, encoding, repetition_levels_byte_length


def read_header(data: bytes | memoryview, position: int, end: int) -> Page:
    """The page whose header starts at ``position`` (its bytes before ``end``)."""
    reader = _Reader(data, position, min(end, position + MAX_HEADER_BYTES))
    top: dict[int, int] = {}
    own: dict[int, dict[int, int]] = {}
    for field, kind in reader.fields():
        if field in (_TYPE, _UNCOMPRESSED, _COMPRESSED) and kind == _I32:
            top[field] = reader.i32()
        elif field in (_DATA_HEADER, _DICTIONARY_HEADER, _DATA_HEADER_V2) and kind == _STRUCT:
            wanted = {_DATA_HEADER: _V1_FIELDS, _DICTIONARY_HEADER: _DICTIONARY_FIELDS}.get(field, _V2_FIELDS)
            own[field] = _struct_i32s(reader, wanted, 1)
        else:
            reader.skip(kind, 1)
    if len(top) != 3:
        raise PageHeaderError(f"a page header at byte {position} lacks its type or sizes")
    kind, uncompressed, compressed = top[_TYPE], top[_UNCOMPRESSED], top[_COMPRESSED]
    if uncompressed < 0 or compressed < 0:
        raise PageHeaderError(f"a page header at byte {position} states a negative size")
    fields = own.get(
        {DATA_PAGE: _DATA_HEADER, DICTIONARY_PAGE: _DICTIONARY_HEADER}.get(kind, _DATA_HEADER_V2)
    )
    if kind in (DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2):
        encoding_field = 4 if kind == DATA_PAGE_V2 else 2
        if fields is None or 1 not in fields or encoding_field not in fields:
            raise PageHeaderError(f"a page header at byte {position} lacks its page type's header")
        if fields[1] < 0:
            raise PageHeaderError(f"a page header at byte {position} states a negative value count")
    fields = fields or {}
    return Page(
        kind=kind,
        body=reader.position,
        compressed=compressed,
        uncompressed=uncompressed,
        values=fields.get(1, 0),
        encoding=fields.get(4 if kind == DATA_PAGE_V2 else 2, PLAIN),
        levels_bytes=max(fields.get(6, 0), 0) if kind == DATA_PAGE_V2 else 0,
        level_encoding=fields.get(4, RLE) if kind == DATA_PAGE else RLE,
    )


def chunk_pages(
    data: bytes | memoryview, start: int, length: int, values: int, most_pages: int
) -> list[Page]:
    """The pages of the column chunk of ``length`` bytes at ``start``, as pyarrow's page reader reads
    them: each header, then its page's bytes, until data pages have held ``values`` values (the
    footer's count for the chunk) or the chunk's bytes end; past ``most_pages`` pages, the walk
    stops (the caller sees one page more than it allows).

    :raises PageHeaderError: a header cannot be read, or a page runs past the chunk.
    """
    end = start + length
    if start < 0 or length < 0 or end > len(data):
        raise PageHeaderError(f"a column chunk at byte {start} runs past the file")
    pages: list[Page] = []
    seen, position = 0, start
    while seen < values and position < end and len(pages) <= most_pages:
        page = read_header(data, position, end)
        position = page.body + page.compressed
        if position > end:
            raise PageHeaderError(f"a page at byte {page.body} runs past its column chunk")
        if page.kind in (DATA_PAGE, DATA_PAGE_V2):
            seen += page.values
        pages.append(page)
    return pages
