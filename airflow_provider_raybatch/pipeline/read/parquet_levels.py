"""What a few Parquet pages hold, read without decoding their values: the rows a nested column's page
starts (from its repetition levels), and the longest value of a dictionary page.

A nested column's page header counts levels (list items), not rows, and one row may span many pages:
the rows each page covers are the levels that start a row (repetition level 0). A dictionary page's
header counts its values, not how long the longest one is, and each index into it decodes to one.
Both are read here in bulk (Python ints as bit vectors), never a value at a time in Python where a
page can hold millions. Anything this cannot read is ``None``: the caller then assumes the most.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read import parquet_pages
from airflow_provider_raybatch.pipeline.read.parquet_pages import Page

if TYPE_CHECKING:
    import pyarrow as pa

#: Parquet's codec names (as pyarrow's metadata spells them) -> pyarrow's. Parquet's old ``LZ4`` is
#: Hadoop's framing, which pyarrow's codecs do not read: its pages count as unreadable here.
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd", "LZ4_RAW": "lz4_raw"}
#: The most values a dictionary page may have for its longest one to be looked for, a value at a time.
MAX_DICTIONARY_SCAN_VALUES = 1 << 20
_LENGTH = struct.Struct("<I")


def page_body(data: bytes, page: Page, codec: str) -> bytes | pa.Buffer | None:
    """A V1 page's or dictionary page's bytes decompressed (as its header states), or None where this
    process cannot decompress them."""
    raw = memoryview(data)[page.body : page.body + page.compressed]
    if codec == "UNCOMPRESSED":
        return raw.tobytes()
    name = _CODECS.get(codec)
    if name is None:
        return None
    import pyarrow as pa

    try:
        return pa.Codec(name).decompress(raw, decompressed_size=page.uncompressed)
    except Exception:  # noqa: BLE001 - pyarrow fails on such a page too, or reads it some other way
        return None


def rows_started(data: bytes, page: Page, codec: str, max_repetition_level: int) -> tuple[int, bool] | None:
    """A nested column's data page: how many rows start in it, and whether it starts inside a row
    (its first level is not 0); None where its repetition levels cannot be read here."""
    width = max_repetition_level.bit_length()
    if page.kind == parquet_pages.DATA_PAGE_V2:  # levels first, never compressed
        return _zeros_and_first(
            memoryview(data)[page.body : page.body + page.levels_bytes], width, page.values
        )
    if page.level_encoding != parquet_pages.RLE:
        return None
    body = page_body(data, page, codec)
    if body is None:
        return None
    view = memoryview(body).cast("B")  # a pyarrow Buffer's view is of signed bytes: levels read as 0-255
    if len(view) < 4:
        return None
    (length,) = _LENGTH.unpack_from(view, 0)
    return _zeros_and_first(view[4 : 4 + length], width, page.values)


def _zeros_and_first(levels: memoryview, width: int, count: int) -> tuple[int, bool] | None:
    """Of the first ``count`` levels of an RLE/bit-packed hybrid run of ``width``-bit levels: how many
    are 0, and whether the first is not 0; None if the runs hold fewer than ``count``."""
    position, seen, zeros, first = 0, 0, 0, None
    byte_width = (width + 7) // 8
    while seen < count:
        header, position = _varint(levels, position)
        if header is None:
            return None
        if header & 1:  # bit-packed: groups of 8 values, ``width`` bytes a group
            groups = header >> 1
            take = min(groups * 8, count - seen)
            packed = levels[position : position + groups * width]
            position += groups * width
            bits = int.from_bytes(packed, "little") & ((1 << take * width) - 1)
            if first is None:
                first = bits & ((1 << width) - 1)
            zeros += take - _nonzero_count(bits, width, take)
        else:  # a run of one value
            run = header >> 1
            take = min(run, count - seen)
            value = int.from_bytes(levels[position : position + byte_width], "little")
            position += byte_width
            if first is None:
                first = value
            zeros += take if value == 0 else 0
        if position > len(levels) or take <= 0:
            return None
        seen += take
    return zeros, bool(first)


def _nonzero_count(bits: int, width: int, count: int) -> int:
    """How many of ``count`` ``width``-bit values packed in ``bits`` (lowest first) are not 0."""
    folded = bits
    for shift in range(1, width):  # each value's bits OR-ed into its lowest bit
        folded |= bits >> shift
    lowest_bits = ((1 << count * width) - 1) // ((1 << width) - 1)  # 1 at the lowest bit of each value
    return (folded & lowest_bits).bit_count()


def _varint(view: memoryview, position: int) -> tuple[int | None, int]:
    value, shift = 0, 0
    while position < len(view) and shift < 35:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return None, position


def longest_dictionary_value(data: bytes, page: Page, codec: str) -> int | None:
    """The longest value of a byte-array dictionary page (PLAIN: each value's length, then its bytes),
    or None where it cannot be read here or holds too many values to look through."""
    if page.values > MAX_DICTIONARY_SCAN_VALUES:
        return None
    body = page_body(data, page, codec)
    if body is None:
        return None
    view = memoryview(body)
    position, longest, end = 0, 0, len(view)
    unpack = _LENGTH.unpack_from
    try:
        for _ in range(page.values):
            length = unpack(view, position)[0]
            position += 4 + length
            if length > longest:
                longest = length
    except struct.error:  # fewer values than its header states: pyarrow fails on it too
        return None
    return longest if position <= end else None
