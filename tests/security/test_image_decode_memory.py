"""What decoding a row's image may hold is bounded in bytes, not only in pixels.

Row data is untrusted (docs/security.md). An image was checked against ``max_pixels`` (64 Mi) alone,
while each step after the decoder made a full-size copy in a mode Pillow stores at 4 bytes a pixel:
an 8192x8192 RGBA PNG of 260 KB, with an EXIF rotation, grew a worker by 1 GiB before it was shrunk
to 2048x2048. Now every copy is counted from the header against ``max_decode_bytes``
(pipeline/read/images.py): an image is decoded in the order that gives the same pixels as ever where
that fits, else a JPEG at a reduced scale or shrunk before it is rotated and converted, else refused
before a pixel is decoded.

Each measure runs in a fresh interpreter: ``ru_maxrss`` is a high-water mark.
"""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read import images  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.images import ImageOptions, load_image  # noqa: E402

MIB = 1 << 20
#: What the interpreter adds to a measure beside the image's own copies (allocator, plugins imported).
SLACK_MIB = 12

_MEASURE = """
import json, resource, sys
from PIL import Image, ImageOps, JpegImagePlugin, PngImagePlugin  # not the image's cost
from airflow_provider_raybatch.pipeline.read.images import ImageOptions, load_image

data = open(sys.argv[1], "rb").read()
options = ImageOptions(**json.loads(sys.argv[2]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    image = load_image(data, options)
    result = {"size": list(image.size)}
except ValueError as err:
    result = {"reason": str(err)}
result["grown_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(result))
"""


def measure(path: Path, **options: Any) -> dict[str, Any]:  # Any: ImageOptions fields; JSON.
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def blank_png(side: int, color_type: int, channels: int, orientation: int) -> bytes:
    """A blank PNG of side x side pixels with an EXIF orientation, written without its pixels in memory."""
    header = struct.pack(">IIBBBBB", side, side, 8, color_type, 0, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    compressor = zlib.compressobj(1)
    row = b"\0" * (1 + side * channels)  # filter byte, then the row's samples
    pixels = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"eXIf", exif.tobytes()),
            _chunk(b"IDAT", pixels),
            _chunk(b"IEND", b""),
        )
    )


def encode(image: Any, fmt: str, **params: Any) -> bytes:  # Any: a PIL image; Pillow save options.
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def photo(width: int, height: int) -> Any:  # Any: a PIL image.
    """Smooth colour blobs, as a photo's JPEG holds (noise scaled up)."""
    small = Image.merge("RGB", [Image.effect_noise((width // 40, height // 40), 60) for _ in range(3)])
    return small.resize((width, height), Image.Resampling.BILINEAR)


def rgba_blobs(side: int) -> Any:  # Any: a PIL image.
    small = Image.merge("RGBA", [Image.effect_noise((side // 40, side // 40), 80) for _ in range(4)])
    return small.resize((side, side), Image.Resampling.BILINEAR)


def exif(orientation: int) -> bytes:
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags.tobytes()


# -- the bound, measured ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("images")
    made = {
        "rgba-png-rotated": encode(rgba_blobs(2048), "PNG", exif=exif(6), compress_level=1),
        "l-png": encode(Image.new("L", (4096, 4096), 90), "PNG", compress_level=1),
        "progressive-jpeg": encode(photo(4096, 4096), "JPEG", progressive=True, quality=85),
    }
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in made}


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_a_small_png_of_64_mi_pixels_is_refused_before_it_is_decoded(tmp_path: Path, mode: str) -> None:
    """Within max_pixels, 130 to 260 KB on disk, and each full-size copy 256 MiB: it grew a worker 1 GiB."""
    color_type, channels = {"RGBA": (6, 4), "LA": (4, 2)}[mode]
    path = tmp_path / "bomb.png"
    path.write_bytes(blank_png(8192, color_type, channels, orientation=6))

    result = measure(path)

    assert result["grown_mib"] < 50, result
    assert result.get("reason", "").startswith(f"image too large: 8192x8192 {mode} pixels need about ")
    assert re.search(r"over max_decode_bytes=192 MiB; shrink it to at most about \d+x\d+$", result["reason"])


@pytest.mark.parametrize(
    ("name", "budget_mib", "accepted"),
    [
        ("rgba-png-rotated", 48, True),  # the order of old: 3 RGBA copies of 16 MiB
        ("rgba-png-rotated", 40, True),  # shrunk first
        ("rgba-png-rotated", 24, False),
        ("l-png", 32, True),  # 1 byte a pixel, shrunk before it becomes RGB
        ("progressive-jpeg", 64, True),  # decoded at a reduced scale; its coefficients counted whole
        ("progressive-jpeg", 40, False),
    ],
)
def test_decoding_holds_at_most_max_decode_bytes(
    samples: dict[str, Path], name: str, budget_mib: int, accepted: bool
) -> None:
    result = measure(samples[name], max_decode_bytes=budget_mib * MIB, max_output_pixels=512 * 512)

    assert ("size" in result) == accepted, result
    assert result["grown_mib"] <= budget_mib + SLACK_MIB, result
    if not accepted:
        assert f"over max_decode_bytes={budget_mib} MiB" in result["reason"]


def test_a_big_jpeg_is_decoded_at_a_reduced_scale_to_the_same_size(tmp_path: Path) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(encode(photo(4000, 3000), "JPEG", quality=85, exif=exif(6)))

    result = measure(path, max_decode_bytes=24 * MIB, max_output_pixels=1000 * 750)

    assert result["size"] == [750, 1000]  # as ever: upright, and at the size asked of the full image
    assert result["grown_mib"] <= 24 + SLACK_MIB, result


# -- the same pixels as before, under the bound --------------------------------------------------


def reference(data: bytes, options: ImageOptions) -> Any:  # Any: a PIL image.
    """What load_image gave before the bound: rotate, composite over white, convert, resize."""
    from PIL import ImageOps

    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image.convert("RGBA"))
    return images.resize_image(image.convert("RGB"), options)


@pytest.mark.parametrize(
    "make",
    [
        lambda: encode(photo(1600, 1200), "JPEG", quality=90, exif=exif(6)),
        lambda: encode(photo(1600, 1200), "JPEG", quality=90, progressive=True),
        lambda: encode(rgba_blobs(1200), "PNG", exif=exif(3), compress_level=1),
        lambda: encode(rgba_blobs(1200).convert("LA"), "PNG", compress_level=1),
        lambda: encode(rgba_blobs(1200).convert("RGB").convert("P"), "GIF", transparency=3),
    ],
    ids=["jpeg-rotated", "jpeg-progressive", "rgba-png-rotated", "la-png", "palette-gif"],
)
def test_an_image_under_the_bound_keeps_its_pixels(make: Any) -> None:  # Any: a maker of bytes.
    data = make()
    for options in (ImageOptions(max_output_pixels=600 * 450), ImageOptions()):  # shrunk, and kept
        assert load_image(data, options).tobytes() == reference(data, options).tobytes()


# -- a preprocess's PIL image ----------------------------------------------------------------------


def test_a_preprocess_image_is_held_to_the_same_bound() -> None:
    big = Image.new("RGBA", (2048, 2048))

    with pytest.raises(ValueError, match=r"^image too large: 2048x2048 RGBA pixels need about \d+ MiB"):
        load_image(big, ImageOptions(max_decode_bytes=24 * MIB))

    assert load_image(big, ImageOptions(max_output_pixels=512 * 512)).size == (512, 512)
    assert big.size == (2048, 2048) and big.mode == "RGBA"  # the preprocess's image is left as it was


def test_a_preprocess_jpeg_opened_lazily_is_decoded_at_a_reduced_scale() -> None:
    lazy = Image.open(io.BytesIO(encode(photo(4000, 3000), "JPEG", quality=85)))

    image = load_image(lazy, ImageOptions(max_decode_bytes=24 * MIB, max_output_pixels=1000 * 750))

    assert image.size == (1000, 750)
