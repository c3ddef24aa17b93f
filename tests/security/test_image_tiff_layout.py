"""A TIFF's strips and tiles are counted from its header before Pillow opens it.

Row data is untrusted (docs/security.md). Opening a TIFF, Pillow builds a Python object for each of
its strips before any size of ours is checked: a 6 MB TIFF of a million one-row strips 16 pixels wide,
every StripOffsets entry pointing at the same 16 bytes, grew the reading process by 644 MiB in 10 s
(24 MB: +2.5 GiB in a minute). pipeline/read/tiff_layout.py walks the pages first and refuses a page
whose strips or tiles are more than its dimensions divide into, or more than MAX_TIFF_VALUES.

The hostile files are written here with struct.pack; the growth is measured in a fresh interpreter
(``ru_maxrss`` is a high-water mark).
"""

from __future__ import annotations

import io
import math
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.tiff_layout import (  # noqa: E402
    MAX_TIFF_PAGES,
    MAX_TIFF_VALUES,
    tiff_layout_problem,
)
from tests.security.image_measure import SLACK_MIB, measure  # noqa: E402


@dataclass(frozen=True)
class Page:
    """One grayscale page whose ``chunks`` strips (or tiles) all point at the same pixels."""

    width: int
    height: int
    chunks: int
    rows_per_strip: int = 1
    tile: tuple[int, int] | None = None


def forged_tiff(*pages: Page, endian: str = "<", big: bool = False, loop: bool = False) -> bytes:
    """A TIFF (``big``: a BigTIFF) of ``pages``; ``loop``: the last page's next page is the first."""
    offset = "Q" if big else "I"
    inline = 8 if big else 4
    header_size = 16 if big else 8
    chunk_bytes = max((p.tile[0] * p.tile[1]) if p.tile else p.width * p.rows_per_strip for p in pages)
    body = bytearray(bytes(chunk_bytes))  # the pixels every strip points at, right after the header
    ifd_offsets: list[int] = []
    ifds: list[tuple[int, bytearray]] = []
    for page in pages:
        offsets_tag, counts_tag = (324, 325) if page.tile else (273, 279)
        each = (page.tile[0] * page.tile[1]) if page.tile else page.width * page.rows_per_strip
        arrays = {
            offsets_tag: (4, struct.pack(f"{endian}{page.chunks}I", *[header_size] * page.chunks)),
            counts_tag: (4, struct.pack(f"{endian}{page.chunks}I", *[each] * page.chunks)),
        }
        numbers = {256: page.width, 257: page.height, 258: 8, 259: 1, 262: 1, 277: 1}
        if page.tile:
            numbers |= {322: page.tile[0], 323: page.tile[1]}
        else:
            numbers[278] = page.rows_per_strip
        entries: list[tuple[int, int, int, bytes]] = []
        for tag, value in numbers.items():
            entries.append((tag, 4, 1, struct.pack(f"{endian}I", value).ljust(inline, b"\0")))
        for tag, (kind, values) in arrays.items():
            if len(values) <= inline:
                entries.append((tag, kind, page.chunks, values.ljust(inline, b"\0")))
            else:
                entries.append(
                    (tag, kind, page.chunks, struct.pack(endian + offset, header_size + len(body)))
                )
                body += values
        ifd_offsets.append(header_size + len(body))
        count = struct.pack(endian + ("Q" if big else "H"), len(entries))
        entry_format = endian + ("HHQ8s" if big else "HHI4s")
        ifd = bytearray(count + b"".join(struct.pack(entry_format, *entry) for entry in sorted(entries)))
        ifds.append((len(body) + len(ifd), ifd))
        body += ifd + bytes(struct.calcsize(offset))  # the next page's offset, patched below
    for index, (end, _) in enumerate(ifds):
        following = ifd_offsets[index + 1] if index + 1 < len(pages) else (ifd_offsets[0] if loop else 0)
        struct.pack_into(endian + offset, body, end, following)
    prefix = b"II" if endian == "<" else b"MM"
    if big:
        header = prefix + struct.pack(f"{endian}HHHQ", 43, 8, 0, ifd_offsets[0])
    else:
        header = prefix + struct.pack(f"{endian}HI", 42, ifd_offsets[0])
    return header + bytes(body)


MILLION_STRIPS = Page(width=16, height=1_000_000, chunks=1_000_000)


def test_a_million_one_row_strips_are_refused_before_pillow_opens_the_file(tmp_path: Path) -> None:
    path = tmp_path / "strips.tif"
    path.write_bytes(forged_tiff(MILLION_STRIPS))
    started = time.monotonic()
    result = measure(path, "TiffImagePlugin")
    assert result.get("reason") == (
        f"bad image: TIFF page 0: StripOffsets holds 1000000 values, over the bound of {MAX_TIFF_VALUES}"
    ), result
    assert result["grown_mib"] < SLACK_MIB, result
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("big", [False, True], ids=["classic", "bigtiff"])
def test_either_byte_order_and_bigtiff_are_walked(endian: str, big: bool) -> None:
    data = forged_tiff(
        Page(width=16, height=MAX_TIFF_VALUES + 1, chunks=MAX_TIFF_VALUES + 1), endian=endian, big=big
    )
    with pytest.raises(ValueError, match=f"StripOffsets holds {MAX_TIFF_VALUES + 1} values, over the bound"):
        load_image(data)


def test_strips_beyond_what_the_dimensions_divide_into_are_refused() -> None:
    data = forged_tiff(Page(width=16, height=16, chunks=1000, rows_per_strip=4))
    with pytest.raises(ValueError, match="StripOffsets holds 1000 values, more than the 4 its 16x16 pixels"):
        load_image(data)


def test_tiles_beyond_what_the_dimensions_divide_into_are_refused() -> None:
    data = forged_tiff(Page(width=64, height=32, chunks=100, tile=(16, 16)))
    assert tiff_layout_problem(data) == (
        "TIFF page 0: TileOffsets holds 100 values, more than the 8 its 64x32 pixels divide into"
    )


def test_a_hostile_later_page_fails_the_row() -> None:
    data = forged_tiff(Page(width=16, height=16, chunks=16), MILLION_STRIPS)
    with pytest.raises(ValueError, match="TIFF page 1: StripOffsets holds 1000000 values"):
        load_image(data)


def test_a_chain_of_pages_that_loops_ends_the_walk() -> None:
    data = forged_tiff(Page(width=16, height=16, chunks=16), Page(width=16, height=16, chunks=16), loop=True)
    assert tiff_layout_problem(data) is None


def test_too_many_pages_are_refused() -> None:
    data = forged_tiff(*[Page(width=16, height=16, chunks=1, rows_per_strip=16)] * (MAX_TIFF_PAGES + 1))
    assert tiff_layout_problem(data) == (
        f"TIFF has more than {MAX_TIFF_PAGES} pages, over the bound of {MAX_TIFF_PAGES}"
    )


def test_bytes_that_are_not_a_tiff_or_are_cut_short_are_left_to_pillow() -> None:
    data = forged_tiff(MILLION_STRIPS)
    assert tiff_layout_problem(b"\x89PNG\r\n\x1a\n") is None
    assert tiff_layout_problem(data[:6]) is None
    assert tiff_layout_problem(data[: len(data) - 20]) is None  # the page's entries are cut short


@pytest.mark.parametrize("compression", ["packbits", "tiff_adobe_deflate", "tiff_lzw"])
def test_an_ordinary_multi_strip_tiff_still_reads(compression: str) -> None:
    source = Image.linear_gradient("L").resize((300, 200)).convert("RGB")
    buffer = io.BytesIO()
    source.save(buffer, format="TIFF", compression=compression, strip_size=3 * 300 * 7)
    data = buffer.getvalue()
    with Image.open(io.BytesIO(data)) as opened:
        assert len(opened.tag_v2[273]) == math.ceil(200 / 7)  # many strips, as the test means
    assert tiff_layout_problem(data) is None
    assert list(load_image(data).getdata()) == list(source.getdata())


def test_a_single_strip_page_still_reads() -> None:
    data = forged_tiff(Page(width=16, height=16, chunks=1, rows_per_strip=16))
    assert load_image(data).size == (16, 16)
