"""A run-length encoded BMP's instructions are counted before Pillow decodes it.

Row data is untrusted (docs/security.md). Pillow decodes RLE8 and RLE4 bitmaps in Python, a loop step
per instruction, and an instruction need not add a pixel (a run past the end of its line is clipped to
none, a delta may move by nothing). pipeline/read/bmp_layout.py walks the instructions first and
refuses more than the pixels and lines can use, more than MAX_BMP_RLE_INSTRUCTIONS, or a bitmap of more
than MAX_BMP_RLE_PIXELS pixels, as the row's ``bad image``.

Measured on a shared 2-core machine, before the walk -> after: a 31 MiB RLE8 file of 64x64 pixels whose
first line is followed by 16 Mi runs that add nothing 6.9 s (and it read as an image) -> 0.0 s; the same
flood without the rest of the image 6.9 s, then ``not enough image data`` -> 0.0 s; 31 MiB of empty
deltas 5.6 s -> 0.0 s; a 147 KB RLE4 file of 4096x4096 pixels 1.1 s and +134 MiB -> 0.0 s. At the bounds,
a 2048x2048 RLE4 file reads in 0.3 s and a 2048x511 one written a pixel a run (1 Mi instructions) in
0.9 s, the walk's 0.4 s included. The files are made here (struct); CPU and growth are measured in a
fresh interpreter. The floods are 8 MiB here: before the walk each cost Pillow 2 s or more.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read.bmp_layout import (  # noqa: E402 - after the skip
    MAX_BMP_RLE_INSTRUCTIONS,
    MAX_BMP_RLE_PIXELS,
    bmp_layout_problem,
)
from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402

FLOOD_BYTES = 8 << 20
RLE8, RLE4 = 1, 2


def bmp(size: tuple[int, int], bits: int, compression: int, data: bytes, *, offset: bool = True) -> bytes:
    """A BMP with a BITMAPINFOHEADER, a grey-ramp palette and ``data`` as its bitmap."""
    width, height = size
    colors = 1 << bits
    palette = b"".join(struct.pack("<BBBB", index * 255 // (colors - 1), 0, 0, 0) for index in range(colors))
    start = 14 + 40 + len(palette)
    info = struct.pack(
        "<IiiHHIIiiII", 40, width, height, 1, bits, compression, len(data), 2835, 2835, colors, 0
    )
    head = b"BM" + struct.pack("<IHHI", start + len(data), 0, 0, start if offset else 0)
    return head + info + palette + data


def lines(height: int, line: bytes) -> bytes:
    """``height`` lines of ``line`` (the instructions of one line), each ended, then the end of bitmap."""
    return (line + b"\x00\x00") * height + b"\x00\x01"


def full_line(width: int) -> bytes:
    """Encoded runs of up to 255 pixels that fill one line, as an encoder writes them."""
    runs = b"\xff\x12" * (width // 255)
    return runs + bytes([width % 255, 0x34]) if width % 255 else runs


def instructions_reason(kind: str, steps: int, size: tuple[int, int], bound: int) -> str:
    return (
        f"bad image: BMP's {kind} data has {steps} instructions or more for {size[0]}x{size[1]} pixels, "
        f"over the bound of {bound} (one a pixel, one a line and an end, at most {MAX_BMP_RLE_INSTRUCTIONS})"
    )


SMALL = (64, 64)
SMALL_BOUND = 64 * 64 + 64 + 1  # a step a pixel, an end a line, the end of the bitmap
EMPTY_RUNS = b"\x40\x07" + b"\x01\x07" * (FLOOD_BYTES // 2)  # a full line, then runs past its end


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            bmp(SMALL, 8, RLE8, EMPTY_RUNS + b"\x00\x00" + lines(63, b"\x40\x07")),
            instructions_reason("RLE8", SMALL_BOUND + 1, SMALL, SMALL_BOUND),
        ),
        (bmp(SMALL, 8, RLE8, EMPTY_RUNS), instructions_reason("RLE8", SMALL_BOUND + 1, SMALL, SMALL_BOUND)),
        (
            bmp(SMALL, 8, RLE8, b"\x40\x07" + b"\x00\x02\x00\x00" * (FLOOD_BYTES // 4)),
            instructions_reason("RLE8", SMALL_BOUND + 1, SMALL, SMALL_BOUND),
        ),
        (
            bmp(SMALL, 4, RLE4, b"\x00\x00" * (FLOOD_BYTES // 2)),
            instructions_reason("RLE4", SMALL_BOUND + 1, SMALL, SMALL_BOUND),
        ),
        (
            bmp((4096, 4096), 4, RLE4, lines(4096, full_line(4096))),
            "bad image: BMP of 4096x4096 pixels in RLE4, over the bound of "
            f"{MAX_BMP_RLE_PIXELS} pixels for run-length data (Pillow decodes it in Python); store it "
            "uncompressed or as PNG",
        ),
    ],
    ids=["empty-runs-then-an-image", "empty-runs", "empty-deltas", "empty-lines-rle4", "rle4-4096x4096"],
)
def test_an_instruction_flood_is_refused(tmp_path: Path, data: bytes, reason: str) -> None:
    path = tmp_path / "flood.bmp"
    path.write_bytes(data)
    result = measure(path, "BmpImagePlugin")
    assert result.get("reason") == reason, result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB, result


def test_at_the_bounds_a_bmp_still_reads() -> None:
    empty_delta = b"\x00\x02\x00\x00"  # moves by nothing: two of them bring the walk to its bound
    exact = bmp(SMALL, 8, RLE8, empty_delta * 2 + lines(64, b"\x01\x07" * 64))  # a pixel a run
    assert bmp_layout_problem(exact) is None
    assert load_image(exact).size == SMALL
    over = bmp(SMALL, 8, RLE8, empty_delta * 3 + lines(64, b"\x01\x07" * 64))
    assert f"bad image: {bmp_layout_problem(over)}" == instructions_reason(
        "RLE8", SMALL_BOUND + 1, SMALL, SMALL_BOUND
    )
    assert bmp_layout_problem(bmp((2048, 2048), 4, RLE4, lines(2048, full_line(2048)))) is None
    assert bmp_layout_problem(bmp((2049, 2048), 4, RLE4, b"\x00\x01")) is not None
    wide = (2048, MAX_BMP_RLE_INSTRUCTIONS // 2048 + 1)  # written a pixel a run: one instruction too many
    flood = bmp(wide, 8, RLE8, lines(wide[1], b"\x01\x07" * 2048))
    assert f"bad image: {bmp_layout_problem(flood)}" == instructions_reason(
        "RLE8", MAX_BMP_RLE_INSTRUCTIONS + 1, wide, MAX_BMP_RLE_INSTRUCTIONS
    )


def test_the_walk_reads_the_data_where_pillow_does() -> None:
    """With no offset in the file header, Pillow reads the bitmap after the palette; absolute blocks are
    padded to a whole word of the file; an end of bitmap ends the walk, whatever follows."""
    absolute = b"\x00\x03\x01\x02\x03\x00" + b"\x3d\x07"  # 3 pixels of their own, padded; 61 in a run
    data = bmp(SMALL, 8, RLE8, lines(64, absolute), offset=False)
    assert bmp_layout_problem(data) is None
    assert load_image(data).size == SMALL
    trailing = bmp(SMALL, 8, RLE8, lines(64, b"\x40\x07") + b"\x00\x00" * FLOOD_BYTES)
    assert bmp_layout_problem(trailing) is None


@pytest.mark.parametrize(
    "image",
    [
        Image.linear_gradient("L").resize((640, 480)).convert("P"),
        Image.linear_gradient("L").resize((640, 480)).convert("RGB"),
        Image.new("1", (100, 50)),
    ],
    ids=["palette", "rgb", "one-bit"],
)
def test_uncompressed_bmps_are_not_walked(image: Image.Image) -> None:
    buffer = io.BytesIO()
    image.save(buffer, format="BMP")
    assert bmp_layout_problem(buffer.getvalue()) is None
    assert load_image(buffer.getvalue()).size == image.size


def test_bytes_that_are_not_a_bmp_or_are_cut_short_are_left_to_pillow() -> None:
    data = bmp(SMALL, 8, RLE8, EMPTY_RUNS)
    assert bmp_layout_problem(b"\x89PNG\r\n\x1a\n") is None
    assert bmp_layout_problem(data[:20]) is None
    assert bmp_layout_problem(data[: 14 + 40 + 1024 + 3]) is None
