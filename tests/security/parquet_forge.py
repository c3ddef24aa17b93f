"""Parquet files written byte by byte, as a hostile writer would: pages of any size their headers
state (compressed as a stream, so a gigabyte page costs the test a few MiB), footers whose totals say
what the forger likes, row groups that share one column chunk.

pyarrow's writer holds a page whole before it compresses it, so it cannot make the files an attacker
makes by hand without holding what they decode to. Only what the tests need: required columns (no
definition levels), flat or inside structs, V1 data pages, PLAIN or dictionary-encoded values.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

# parquet.thrift's enums
BYTE_ARRAY, INT64 = 6, 2
PLAIN, RLE, RLE_DICTIONARY = 0, 3, 8
DATA_PAGE, DICTIONARY_PAGE = 0, 2
UNCOMPRESSED, ZSTD = 0, 6
_REQUIRED, _UTF8 = 0, 0
# Thrift compact protocol's types
_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def i32(value: int) -> tuple[int, bytes]:
    return _I32, _varint(_zigzag(value))


def i64(value: int) -> tuple[int, bytes]:
    return _I64, _varint(_zigzag(value))


def binary(value: bytes) -> tuple[int, bytes]:
    return _BINARY, _varint(len(value)) + value


def thrift_struct(fields: dict[int, tuple[int, bytes]]) -> tuple[int, bytes]:
    out, last = bytearray(), 0
    for field_id in sorted(fields):
        kind, body = fields[field_id]
        delta = field_id - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out += bytes([kind]) + _varint(_zigzag(field_id))
        out += body
        last = field_id
    return _STRUCT, bytes(out) + b"\x00"


def thrift_list(items: list[tuple[int, bytes]]) -> tuple[int, bytes]:
    kind = items[0][0] if items else _I32
    head = bytes([len(items) << 4 | kind]) if len(items) < 15 else bytes([0xF0 | kind]) + _varint(len(items))
    return _LIST, head + b"".join(body for _, body in items)


def zstd(pieces: Iterable[bytes]) -> bytes:
    """The pieces compressed as one zstd stream, never held decompressed."""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        for piece in pieces:
            out.write(piece)
    return sink.getvalue().to_pybytes()


def plain_values(values: Iterable[bytes]) -> Iterable[bytes]:
    """PLAIN byte-array values: each one's 4-byte length, then its bytes."""
    for value in values:
        yield struct.pack("<I", len(value))
        yield value


def bit_packed_indices(count: int) -> bytes:
    """Dictionary indices 0, 1, ... count - 1 (a multiple of 8): their bit width, then one bit-packed run."""
    width = max(count - 1, 1).bit_length()
    packed = 0
    for index in range(count):
        packed |= index << (index * width)
    return bytes([width]) + _varint((count // 8) << 1 | 1) + packed.to_bytes(count * width // 8, "little")


@dataclass
class ForgedPage:
    """One page: its body (already compressed as the column's codec) and what its header states."""

    body: bytes
    uncompressed: int
    values: int
    kind: int = DATA_PAGE
    encoding: int = PLAIN

    def header(self) -> bytes:
        own = {1: i32(self.values), 2: i32(self.encoding)}
        if self.kind == DATA_PAGE:
            own |= {3: i32(RLE), 4: i32(RLE)}
        slot = 5 if self.kind == DATA_PAGE else 7
        fields = {
            1: i32(self.kind),
            2: i32(self.uncompressed),
            3: i32(len(self.body)),
            slot: thrift_struct(own),
        }
        return thrift_struct(fields)[1]


@dataclass
class ForgedColumn:
    """A required column (``path``: its name, or a struct's name then the field's), and its pages."""

    path: list[str]
    pages: list[ForgedPage]
    physical: int = BYTE_ARRAY
    codec: int = ZSTD
    #: What the footer says the chunk decompresses to; default: the truth.
    declared_uncompressed: int | None = None
    chunk: tuple[int, int] = field(default=(0, 0))  # (offset, bytes), set once written


def parquet(columns: list[ForgedColumn], rows: int, row_groups: int = 1) -> bytes:
    """A Parquet file of ``row_groups`` row groups of ``rows`` rows each, every one made of the same
    column chunks (written once)."""
    out = bytearray(b"PAR1")
    for column in columns:
        start = len(out)
        for page in column.pages:
            out += page.header() + page.body
        column.chunk = (start, len(out) - start)
    footer = _file_metadata(columns, rows, row_groups)
    return bytes(out) + footer + struct.pack("<I", len(footer)) + b"PAR1"


def _file_metadata(columns: list[ForgedColumn], rows: int, row_groups: int) -> bytes:
    schema = [thrift_struct({4: binary(b"schema"), 5: i32(len({column.path[0] for column in columns}))})]
    for column in columns:
        for depth, name in enumerate(column.path[:-1]):  # structs of one field each
            schema.append(thrift_struct({3: i32(_REQUIRED), 4: binary(name.encode()), 5: i32(1)}))
            del depth
        leaf = {1: i32(column.physical), 3: i32(_REQUIRED), 4: binary(column.path[-1].encode())}
        if column.physical == BYTE_ARRAY:
            leaf[6] = i32(_UTF8)
        schema.append(thrift_struct(leaf))
    group = thrift_struct(
        {1: thrift_list([_column_chunk(column) for column in columns]), 2: i64(0), 3: i64(rows)}
    )
    return thrift_struct(
        {
            1: i32(1),
            2: thrift_list(schema),
            3: i64(rows * row_groups),
            4: thrift_list([group] * row_groups),
            6: binary(b"forge"),
        }
    )[1]


def _column_chunk(column: ForgedColumn) -> tuple[int, bytes]:
    offset, size = column.chunk
    dictionary = column.pages[0].kind == DICTIONARY_PAGE
    data_offset = offset + (len(column.pages[0].header()) + len(column.pages[0].body) if dictionary else 0)
    truth = sum(len(page.header()) + page.uncompressed for page in column.pages)
    declared = truth if column.declared_uncompressed is None else column.declared_uncompressed
    meta = {
        1: i32(column.physical),
        2: thrift_list(sorted({i32(page.encoding) for page in column.pages} | {i32(RLE)})),
        3: thrift_list([binary(name.encode()) for name in column.path]),
        4: i32(column.codec),
        5: i64(sum(page.values for page in column.pages if page.kind == DATA_PAGE)),
        6: i64(declared),
        7: i64(size),
        9: i64(data_offset),
    }
    if dictionary:
        meta[11] = i64(offset)
    return thrift_struct({2: i64(offset), 3: thrift_struct(meta)})


def plain_page(value: bytes, count: int) -> ForgedPage:
    """A zstd page of ``count`` PLAIN byte-array values, each ``value``."""
    return ForgedPage(
        body=zstd(plain_values([value] * count)), uncompressed=count * (4 + len(value)), values=count
    )


def dictionary_pages(values: int, value_bytes: int) -> list[ForgedPage]:
    """A zstd dictionary page of ``values`` distinct values of ``value_bytes`` bytes each (a multiple
    of 8), and a data page that uses each once."""
    distinct = (index.to_bytes(8, "little") * (value_bytes // 8) for index in range(values))
    dictionary = ForgedPage(
        body=zstd(plain_values(distinct)),
        uncompressed=values * (4 + value_bytes),
        values=values,
        kind=DICTIONARY_PAGE,
    )
    indices = bit_packed_indices(values)
    data = ForgedPage(body=zstd([indices]), uncompressed=len(indices), values=values, encoding=RLE_DICTIONARY)
    return [dictionary, data]


def rewritten_footer(data: bytes, chunk_bytes: int, created_by: bytes | None = None) -> bytes:
    """A pyarrow-written file of one column chunk, its footer saying the chunk is ``chunk_bytes`` long
    (``total_compressed_size``) and, given ``created_by``, that this writer wrote it."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    footer_length = struct.unpack("<I", data[-8:-4])[0]
    body, footer = data[: -8 - footer_length], data[-8 - footer_length : -8]
    # total_compressed_size, an i64 field one after the last in ColumnMetaData (and in RowGroup: both go)
    old = bytes([1 << 4 | _I64]) + _varint(_zigzag(metadata.row_group(0).column(0).total_compressed_size))
    if old not in footer:
        raise ValueError("the footer's chunk size is not found; write a file of one column chunk")
    footer = footer.replace(old, bytes([1 << 4 | _I64]) + _varint(_zigzag(chunk_bytes)))
    if created_by is not None:
        written = metadata.created_by.encode()
        footer = footer.replace(_varint(len(written)) + written, _varint(len(created_by)) + created_by)
    return body + footer + struct.pack("<I", len(footer)) + b"PAR1"
