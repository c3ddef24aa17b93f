"""A PNG's chunks are counted before Pillow opens it.

Row data is untrusted (docs/security.md). Pillow handles every chunk before the image data in Python
and bounds only what one chunk inflates to: iCCP chunks of 1 KiB, each inflating to just under its
1 MiB limit, cost about 7 s of CPU per MiB of file; empty private chunks are kept in a list; empty
tEXt chunks cost seconds per MiB. pipeline/read/png_layout.py walks the
chunk list first and refuses more than MAX_PNG_CHUNKS chunks besides IDAT and fdAT, or more than
MAX_PNG_ICCP iCCP chunks, as the row's ``bad image``.

Measured on a shared 2-core machine, before the walk -> after: 1,000 iCCP chunks (1 MiB) 6.6 s of
CPU -> 0.0 s; 31 MiB of empty prVt chunks 25 s and +622 MiB -> 0.001 s and +0 MiB; 8 MiB of empty
tEXt chunks 3.5 s -> 0.001 s. The hostile files are made here by adding chunks (struct, zlib) to a PNG
Pillow wrote; CPU and growth are measured in a fresh interpreter.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")
PngImagePlugin = pytest.importorskip("PIL.PngImagePlugin")

from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.png_layout import (  # noqa: E402
    MAX_PNG_CHUNKS,
    MAX_PNG_ICCP,
    png_layout_problem,
)
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402


def chunk(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(size: tuple[int, int] = (64, 64), **save: Any) -> bytes:  # Any: Pillow's save options.
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize(size).save(buffer, format="PNG", **save)
    return buffer.getvalue()


def before_image_data(inserted: bytes, data: bytes | None = None) -> bytes:
    """A PNG with ``inserted`` before its first IDAT, where Pillow handles each chunk as it opens it."""
    data = png() if data is None else data
    first = data.find(b"IDAT") - 4
    return data[:first] + inserted + data[first:]


#: A profile of 1 KiB that inflates to just under Pillow's 1 MiB limit for one chunk.
INFLATING_ICCP = chunk(b"iCCP", b"p\0\0" + zlib.compress(bytes((1 << 20) - 1), 9))


def test_a_flood_of_inflating_iccp_chunks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "iccp.png"
    path.write_bytes(before_image_data(INFLATING_ICCP * 300))
    result = measure(path, "PngImagePlugin")
    assert result.get("reason") == (
        f"bad image: PNG has {MAX_PNG_ICCP + 1} iCCP chunks or more, over the bound of {MAX_PNG_ICCP}"
    ), result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result


@pytest.mark.parametrize(
    ("flood", "nbytes"),
    [(chunk(b"prVt"), 8 << 20), (chunk(b"tEXt", b"k\0"), 4 << 20)],
    ids=["private", "text"],
)
def test_a_flood_of_small_chunks_is_refused(tmp_path: Path, flood: bytes, nbytes: int) -> None:
    path = tmp_path / "flood.png"
    path.write_bytes(before_image_data(flood * (nbytes // len(flood))))
    result = measure(path, "PngImagePlugin")
    assert result.get("reason") == (
        f"bad image: PNG has {MAX_PNG_CHUNKS + 1} chunks or more besides its image data, "
        f"over the bound of {MAX_PNG_CHUNKS}"
    ), result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB, result


def test_chunks_after_the_image_data_are_counted() -> None:
    data = png()
    end = data.rfind(b"IEND") - 4
    hostile = data[:end] + chunk(b"tEXt", b"k\0") * MAX_PNG_CHUNKS + data[end:]
    with pytest.raises(ValueError, match=f"PNG has {MAX_PNG_CHUNKS + 1} chunks or more"):
        load_image(hostile)


def test_image_data_chunks_are_not_counted_with_the_others() -> None:
    data = png()
    split = before_image_data(chunk(b"IDAT") * (MAX_PNG_CHUNKS - 1))  # empty IDATs are valid
    assert png_layout_problem(split) is None
    assert load_image(split).size == (64, 64)
    assert png_layout_problem(data + chunk(b"tEXt") * (MAX_PNG_CHUNKS * 2)) is None  # after IEND


def test_image_data_split_as_encoders_split_it_reads_and_a_flood_of_empty_chunks_does_not() -> None:
    """Pillow checks each IDAT's CRC in Python: 31 MiB of empty ones took 7.2 s. Chunks of image data
    may average no less than MIN_DATA_CHUNK_BYTES once there are more than MAX_PNG_CHUNKS of them."""
    from airflow_provider_raybatch.pipeline.read.png_layout import MIN_DATA_CHUNK_BYTES

    small_chunks = png((1024, 1024), compress_level=0)
    first = small_chunks.find(b"IDAT") - 4
    end = small_chunks.rfind(b"IEND") - 4
    pixels = b"".join(
        small_chunks[at + 8 : at + 8 + struct.unpack(">I", small_chunks[at : at + 4])[0]]
        for at in _chunk_offsets(small_chunks, b"IDAT")
    )
    resplit = b"".join(chunk(b"IDAT", pixels[i : i + 512]) for i in range(0, len(pixels), 512))
    fine = small_chunks[:first] + resplit + small_chunks[end:]
    assert len(resplit) // (512 + 12) > MAX_PNG_CHUNKS  # more chunks than the other bound
    assert png_layout_problem(fine) is None and load_image(fine).size[0] > 0

    flood = before_image_data(chunk(b"IDAT") * (4 * MAX_PNG_CHUNKS))
    bound = max(MAX_PNG_CHUNKS, len(flood) // MIN_DATA_CHUNK_BYTES)
    assert png_layout_problem(flood) == (
        f"PNG has {bound + 1} image data chunks or more, over the bound of {bound} "
        f"(one for every {MIN_DATA_CHUNK_BYTES} bytes of the file)"
    )


def _chunk_offsets(data: bytes, kind: bytes) -> list[int]:
    offsets, at = [], 8
    while at + 8 <= len(data):
        length = struct.unpack(">I", data[at : at + 4])[0]
        if data[at + 4 : at + 8] == kind:
            offsets.append(at)
        at += 12 + length
    return offsets


def test_bytes_that_are_not_a_png_or_are_cut_short_are_left_to_pillow() -> None:
    data = before_image_data(chunk(b"prVt") * (MAX_PNG_CHUNKS * 2))
    assert png_layout_problem(b"\xff\xd8\xff\xe0") is None
    assert png_layout_problem(data[:20]) is None
    assert png_layout_problem(data[:500]) is None


def _with_text_and_profile() -> bytes:
    info = PngImagePlugin.PngInfo()
    for index in range(50):
        info.add_text(f"key{index}", "value " * 20, zip=index % 2 == 0)
    info.add_itxt("title", "a title", lang="en")
    return png((96, 64), pnginfo=info, icc_profile=bytes(3000))


def _apng(frames: int) -> bytes:
    images = [Image.new("RGB", (16, 16), (index % 256, 0, 0)) for index in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="PNG", save_all=True, append_images=images[1:], duration=40)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png((640, 480)), (640, 480)),
        (png((640, 480), optimize=True), (640, 480)),
        (_with_text_and_profile(), (96, 64)),
        (_apng(3), (16, 16)),
        (_apng(600), (16, 16)),
    ],
    ids=["plain", "optimized", "text-and-iccp", "apng-3-frames", "apng-600-frames"],
)
def test_ordinary_pngs_still_read(data: bytes, size: tuple[int, int]) -> None:
    assert png_layout_problem(data) is None
    assert load_image(data).size == size


def test_an_apng_of_600_frames_is_one_fctl_a_frame() -> None:
    data = _apng(600)
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.n_frames == 600  # Pillow reads every frame's count; the reader decodes the first
    assert data.count(b"fcTL") == 600
