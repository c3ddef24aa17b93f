"""A TIFF's strip and tile counts, read from its header before Pillow opens the file.

Opening a TIFF, Pillow loads every tag of its first page (an array of N values becomes an N-tuple)
and builds one tile entry per strip or tile, about 650 bytes of Python objects for each, before any
size of ours can be checked. A file may list a million one-row strips that all point at the same 16
bytes: 6 MB of offsets whose pixels pass every pixel bound grew the reading process by 644 MiB. So
this module walks the file's pages (IFDs) itself, reading each entry's count and never its values,
and names what no image needs: more strips or tiles than the page's dimensions divide into, or an
array of more than ``MAX_TIFF_VALUES`` values. The walk is bounded too (``MAX_TIFF_PAGES`` pages of
at most ``MAX_TIFF_TAGS`` entries, each page's offset visited once), so a cyclic or endless chain of
pages costs nothing. Classic TIFF and BigTIFF, either byte order, as Pillow accepts them.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

#: Values one tag of a page may hold (strip or tile offsets and byte counts included): a 64 Mi pixel
#: image in one-row strips of 2048 pixels, or in 256x256 tiles with four planes, stays well under it,
#: and Pillow's objects for this many strips take about 20 MiB.
MAX_TIFF_VALUES = 1 << 15
#: Pages walked: a row's image is its first page, and a document of a thousand pages is not one.
MAX_TIFF_PAGES = 1024
#: Entries in one page: a TIFF's pages carry a few dozen tags.
MAX_TIFF_TAGS = 1024

_IMAGE_WIDTH, _IMAGE_LENGTH, _SAMPLES_PER_PIXEL, _ROWS_PER_STRIP, _PLANAR_CONFIGURATION = (
    256,
    257,
    277,
    278,
    284,
)
_TILE_WIDTH, _TILE_LENGTH = 322, 323
#: The arrays Pillow turns into one tile entry a value, by the name a reason gives them.
_CHUNK_TAGS = {273: "StripOffsets", 279: "StripByteCounts", 324: "TileOffsets", 325: "TileByteCounts"}
#: Types Pillow keeps as one bytes object whatever their count (BYTE, ASCII, SBYTE, UNDEFINED).
_BYTE_TYPES = frozenset({1, 2, 6, 7})
#: What an unsigned integer of each type (SHORT, LONG, LONG8) is read as.
_UNSIGNED = {3: "H", 4: "I", 16: "Q"}


@dataclass(frozen=True)
class _Format:
    """How a file's header says its numbers are laid out: byte order, and classic or BigTIFF."""

    endian: str  # "<" or ">"
    big: bool

    @property
    def offset(self) -> str:
        return "Q" if self.big else "I"

    @property
    def entry(self) -> struct.Struct:  # tag, type, count, the value or its offset
        return struct.Struct(self.endian + ("HHQ8s" if self.big else "HHI4s"))

    @property
    def count(self) -> struct.Struct:
        return struct.Struct(self.endian + ("Q" if self.big else "H"))


def _format(data: bytes) -> _Format | None:
    """The layout of a file Pillow would open as a TIFF (its accepted prefixes), else None."""
    if data[:2] not in (b"II", b"MM") or data[2:4] not in (
        b"\x2a\x00",
        b"\x00\x2a",
        b"\x2b\x00",
        b"\x00\x2b",
    ):
        return None
    return _Format("<" if data[:2] == b"II" else ">", 0x2B in data[2:4])


def tiff_layout_problem(data: bytes) -> str | None:
    """Why a TIFF's pages would cost Pillow more than any image needs, or None.

    None also for bytes that are not a TIFF, and for a TIFF too broken to walk: Pillow then refuses
    it itself, at no cost beyond its header. The reason names the page, the tag, its count and the
    bound it is over.
    """
    layout = _format(data)
    if layout is None:
        return None
    first = 8 if layout.big else 4
    offset = _unpack(layout.endian + layout.offset, data, first)
    seen: set[int] = set()
    page = 0
    while offset:
        if offset in seen:
            return None  # a chain that loops back: Pillow stops at a page it has read
        if page >= MAX_TIFF_PAGES:
            return f"TIFF has more than {MAX_TIFF_PAGES} pages, over the bound of {MAX_TIFF_PAGES}"
        seen.add(offset)
        walked = _page(data, layout, offset, page)
        if walked is None:
            return None
        problem, offset = walked
        if problem:
            return problem
        page += 1
    return None


def _page(data: bytes, layout: _Format, offset: int, page: int) -> tuple[str | None, int] | None:
    """(the page's problem or None, the next page's offset); None where the page is cut short."""
    count_size, entry = layout.count.size, layout.entry
    tags = _unpack(layout.count.format, data, offset)
    if tags is None:
        return None
    if tags > MAX_TIFF_TAGS:
        return f"TIFF page {page} has {tags} tags, over the bound of {MAX_TIFF_TAGS}", 0
    start = offset + count_size
    if start + tags * entry.size > len(data):
        return None
    entries = [entry.unpack_from(data, start + index * entry.size) for index in range(tags)]
    numbers = {tag: _inline(layout, kind, count, value) for tag, kind, count, value in entries}
    needed = _chunks_needed(numbers)
    for tag, kind, count, _ in entries:
        name = _CHUNK_TAGS.get(tag, f"tag {tag}")
        if tag in _CHUNK_TAGS and needed is not None and count > needed:
            return (
                f"TIFF page {page}: {name} holds {count} values, more than the {needed} its "
                f"{numbers[_IMAGE_WIDTH]}x{numbers[_IMAGE_LENGTH]} pixels divide into",
                0,
            )
        if kind not in _BYTE_TYPES and count > MAX_TIFF_VALUES:
            return f"TIFF page {page}: {name} holds {count} values, over the bound of {MAX_TIFF_VALUES}", 0
    following = _unpack(layout.endian + layout.offset, data, start + tags * entry.size)
    return None, following or 0


def _inline(layout: _Format, kind: int, count: int, value: bytes) -> int | None:
    """A single SHORT, LONG or LONG8 held in the entry itself, else None."""
    code = _UNSIGNED.get(kind)
    if code is None or count != 1 or struct.calcsize(code) > len(value):
        return None
    return struct.unpack_from(layout.endian + code, value)[0]


def _chunks_needed(numbers: dict[int, int | None]) -> int | None:
    """The strips or tiles a page's dimensions divide into (planes counted); None where not stated."""
    width, height = numbers.get(_IMAGE_WIDTH), numbers.get(_IMAGE_LENGTH)
    if not width or not height:
        return None
    samples = numbers.get(_SAMPLES_PER_PIXEL) or 1
    planes = samples if numbers.get(_PLANAR_CONFIGURATION) == 2 else 1
    tile_width, tile_length = numbers.get(_TILE_WIDTH), numbers.get(_TILE_LENGTH)
    if tile_width and tile_length:
        return math.ceil(width / tile_width) * math.ceil(height / tile_length) * planes
    rows = numbers.get(_ROWS_PER_STRIP) or height  # absent: the whole image is one strip
    return math.ceil(height / min(rows, height)) * planes


def _unpack(code: str, data: bytes, at: int) -> int | None:
    size = struct.calcsize(code)
    if at < 0 or at + size > len(data):
        return None
    return int(struct.unpack_from(code, data, at)[0])
