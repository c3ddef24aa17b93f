"""An image's EXIF block is bounded before Pillow parses it for the orientation, whatever the container.

Row data is untrusted (docs/security.md). Reading an image's orientation, Pillow parses the whole EXIF
block (an N-tuple for each array of N values) and ``exif_transpose`` writes it out again. A JPEG's
APP1 segment holds 64 KiB, but Pillow joins every APP1 Exif segment, and takes a PNG's eXIf chunk or
``exif`` / ``Raw profile type exif`` text and a WebP's EXIF chunk at any size. The layout walks refuse
an eXIf or EXIF chunk, or APP1 Exif segments together, over MAX_EXIF_BYTES before Pillow opens the file
(pipeline/read/png_layout.py, webp_layout.py, jpeg_layout.py), and pipeline/read/exif_bound.py measures
the block Pillow found (text chunks included) before anything parses it: the row's ``bad image``.

Measured on a shared 2-core machine, each file a 64x64 image with orientation 6 and one array of values,
before -> after: PNG eXIf of 7 M LONGs (28 MB) 4.6 s and +1,259 MiB -> 0.0 s and +0 MiB; of 7 M SHORTs
4.5 s and +1,208 MiB -> 0.0 s; of 500 k RATIONALs (4 MB) 3.5 s and +156 MiB -> 0.0 s; WebP EXIF of 7 M
SHORTs 4.5 s and +1,238 MiB -> 0.0 s; JPEG of 14 MB of APP1 Exif segments 5.9 s and +1,289 MiB -> 0.0 s.
At the bound the worst block found (one array of RATIONALs) reads in 0.07 s and +5 MiB; Pillow reads
no more tag data than the block holds, so 2,700 tags sharing one array cost no more. The files here are
1-4 MB: before the bound they read as images, at 0.4-1.4 s and +10-280 MiB each.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest

Image = pytest.importorskip("PIL.Image")
if not pytest.importorskip("PIL.features").check("webp"):
    pytest.skip("Pillow was built without WebP", allow_module_level=True)

from airflow_provider_raybatch.pipeline.read.exif_bound import MAX_EXIF_BYTES  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402

ORIENTATION, ROTATED_90 = 0x0112, 6
SHORT, LONG, RATIONAL = 3, 4, 5
_UNIT = {SHORT: 2, LONG: 4, RATIONAL: 8}


def exif(values: int, kind: int = SHORT, tags: int = 1) -> bytes:
    """A big-endian TIFF block: orientation 6, then ``tags`` private tags that all point at one array
    of ``values`` values of ``kind``."""
    entries = 1 + tags
    array_at = 8 + 2 + 12 * entries + 4
    block = b"MM\x00*" + struct.pack(">IH", 8, entries)
    block += struct.pack(">HHIHH", ORIENTATION, SHORT, 1, ROTATED_90, 0)
    block += b"".join(struct.pack(">HHII", 0xC000 + tag, kind, values, array_at) for tag in range(tags))
    return block + struct.pack(">I", 0) + (bytes(_UNIT[kind] - 1) + b"\x01") * values


def at_most(nbytes: int, kind: int = RATIONAL, tags: int = 1) -> bytes:
    """The block of ``tags`` tags sharing the longest array of ``kind`` that keeps it within ``nbytes``."""
    head = 8 + 2 + 12 * (1 + tags) + 4
    return exif((nbytes - head) // _UNIT[kind], kind, tags)


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def picture(image_format: str, size: tuple[int, int] = (64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize(size).convert("RGB").save(buffer, format=image_format)
    return buffer.getvalue()


def png_with(inserted: bytes, size: tuple[int, int] = (64, 64)) -> bytes:
    """A PNG with ``inserted`` chunks after its header, before its image data."""
    data = picture("PNG", size)
    return data[:33] + inserted + data[33:]


def webp_with(block: bytes, size: tuple[int, int] = (64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize(size).convert("RGB").save(
        buffer, format="WEBP", lossless=True, exif=block
    )
    return buffer.getvalue()


def jpeg_with(block: bytes, size: tuple[int, int] = (64, 64)) -> bytes:
    """A JPEG carrying ``block`` in as many full APP1 Exif segments as it takes, as Pillow joins them."""
    step = 0xFFFF - 2 - 6
    segments = b"".join(
        b"\xff\xe1"
        + struct.pack(">H", 2 + 6 + len(block[at : at + step]))
        + b"Exif\x00\x00"
        + block[at : at + step]
        for at in range(0, len(block), step)
    )
    data = picture("JPEG", size)
    return data[:2] + segments + data[2:]


def hex_text(block: bytes) -> bytes:
    """ImageMagick's ``Raw profile type exif`` text: a header, then hex digits in lines of 72."""
    digits = block.hex()
    lines = "\n".join(digits[at : at + 72] for at in range(0, len(digits), 72))
    return f"\nexif\n{len(block):8}\n{lines}\n".encode("latin-1")


FLOOD = exif(2_000_000)  # 4 MB: before the bound, +360 MiB and a second and a half
FLOOD_TIFF_BYTES = len(FLOOD)


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        (
            "flood.png",
            png_with(chunk(b"eXIf", FLOOD)),
            f"PNG's eXIf chunk holds {FLOOD_TIFF_BYTES} bytes, over the bound of {MAX_EXIF_BYTES} for EXIF",
        ),
        (
            "flood.webp",
            webp_with(FLOOD),
            f"WebP's EXIF chunk holds {FLOOD_TIFF_BYTES} bytes, over the bound of {MAX_EXIF_BYTES}",
        ),
        (
            "flood.jpg",
            jpeg_with(FLOOD),
            f"JPEG's APP1 Exif segments hold {2 * (0xFFFF - 8)} bytes or more, "
            f"over the bound of {MAX_EXIF_BYTES}",
        ),
        (
            "text.png",
            png_with(chunk(b"tEXt", b"exif\x00" + exif(1_000_000))),
            f"EXIF of {len(exif(1_000_000))} bytes, over the bound of {MAX_EXIF_BYTES}; "
            "strip or shrink its metadata",
        ),
        (
            "hex.png",
            png_with(chunk(b"tEXt", b"Raw profile type exif\x00" + hex_text(exif(500_000)))),
            f"EXIF of about {len(exif(500_000)) + 6} bytes (as 'Raw profile type exif' text), "
            f"over the bound of {MAX_EXIF_BYTES}; strip or shrink its metadata",
        ),
    ],
    ids=["png-exif-chunk", "webp-exif-chunk", "jpeg-app1-segments", "png-exif-text", "png-hex-text"],
)
def test_an_exif_block_over_the_bound_is_refused(tmp_path: Path, name: str, data: bytes, reason: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    plugin = {"png": "PngImagePlugin", "webp": "WebPImagePlugin", "jpg": "JpegImagePlugin"}[
        name.split(".")[1]
    ]
    result = measure(path, plugin)
    assert result.get("reason") == f"bad image: {reason}", result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB + 3 * len(data) / 2**20, result  # Pillow's copies of a text chunk


@pytest.mark.filterwarnings("ignore:Tag data larger than file")  # Pillow reads a shared array once
@pytest.mark.parametrize(
    "block",
    [at_most(MAX_EXIF_BYTES), at_most(MAX_EXIF_BYTES, tags=2700), at_most(MAX_EXIF_BYTES, SHORT, tags=2700)],
    ids=["one-array", "2700-tags-sharing-rationals", "2700-tags-sharing-shorts"],
)
def test_at_the_bound_the_exif_is_read_and_applied(block: bytes) -> None:
    assert len(block) <= MAX_EXIF_BYTES
    for data in (png_with(chunk(b"eXIf", block), (96, 64)), webp_with(block, (96, 64))):
        assert load_image(data).size == (64, 96)  # orientation 6: turned a quarter


def test_one_full_app1_segment_is_within_the_bound() -> None:
    block = at_most(0xFFFF - 8, LONG)
    assert load_image(jpeg_with(block, (96, 64))).size == (64, 96)


def test_ordinary_exif_still_reads() -> None:
    camera = Image.Exif()
    camera[ORIENTATION] = ROTATED_90
    camera[0x010F] = "a camera"
    camera[0x0110] = "a model"
    for image_format in ("JPEG", "PNG", "WEBP"):
        buffer = io.BytesIO()
        Image.new("RGB", (96, 64), (10, 20, 30)).save(buffer, format=image_format, exif=camera.tobytes())
        assert load_image(buffer.getvalue()).size == (64, 96), image_format
