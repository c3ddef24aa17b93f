"""A WebP's RIFF chunks are counted before Pillow opens it.

Row data is untrusted (docs/security.md). Pillow opens every WebP with libwebp's animation decoder,
whose demuxer parses the whole file at open and keeps an entry for each unknown chunk and each
animation frame (ANMF). pipeline/read/webp_layout.py walks the chunk list first and refuses more than
MAX_WEBP_CHUNKS chunks besides the frames, or more than MAX_WEBP_FRAMES frames, as the row's
``bad image``.

Measured on a shared 2-core machine with files of just under 32 MiB that each read as a 64x64 image,
before the walk -> after: 4 Mi empty unknown chunks after an extended (VP8X) image 1.2 s and +354 MiB
-> 0.0 s and +0 MiB; after a simple lossy image 0.3 s and +100 MiB -> 0.001 s; one-pixel ANMF frames
on a 64x64 canvas 0.5 s and +231 MiB -> 0.0 s. 1,000 such frames cost 0.04 s and +4 MiB before and
after. The hostile files are made here (struct) from WebPs Pillow wrote; CPU and growth are measured
in a fresh interpreter.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")
ImageCms = pytest.importorskip("PIL.ImageCms")
if not pytest.importorskip("PIL.features").check("webp"):
    pytest.skip("Pillow was built without WebP", allow_module_level=True)

from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.webp_layout import (  # noqa: E402
    MAX_WEBP_CHUNKS,
    MAX_WEBP_FRAMES,
    webp_layout_problem,
)
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402

#: Hostile files are this big: before the walk, libwebp's demuxer grew the process by 90-230 MiB.
FLOOD_BYTES = 30 << 20


def webp(size: tuple[int, int] = (64, 64), frames: int = 1, **save: Any) -> bytes:  # Any: save options.
    images = [
        Image.linear_gradient("L").resize(size).point(lambda value, i=index: (value + i) % 256).convert("RGB")
        for index in range(frames)
    ]
    buffer = io.BytesIO()
    images[0].save(buffer, format="WEBP", save_all=frames > 1, append_images=images[1:], **save)
    return buffer.getvalue()


def riff(chunks: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WEBP" + chunks


def chunks_of(data: bytes) -> list[bytes]:
    found, at = [], 12
    while at + 8 <= len(data):
        size = struct.unpack_from("<I", data, at + 4)[0]
        found.append(data[at : at + 8 + size + (size & 1)])
        at += 8 + size + (size & 1)
    return found


def one_pixel_frames(frames: int) -> bytes:
    """An animation on a 64x64 canvas of ``frames`` one-pixel ANMF frames, from one Pillow wrote."""
    buffer = io.BytesIO()
    pixels = [Image.new("RGB", (1, 1), (index, 0, 0)) for index in range(2)]
    pixels[0].save(buffer, format="WEBP", save_all=True, append_images=pixels[1:], lossless=True)
    head, *rest = chunks_of(buffer.getvalue())
    canvas = head[:12] + (63).to_bytes(3, "little") * 2 + head[18:]
    others = [chunk for chunk in rest if not chunk.startswith(b"ANMF")]
    anmf = next(chunk for chunk in rest if chunk.startswith(b"ANMF"))
    return riff(canvas + b"".join(others) + anmf * frames)


UNKNOWN = b"XXXX" + bytes(4)  # an empty chunk of a kind libwebp does not know, kept all the same
CHUNKS_REASON = (
    f"bad image: WebP has {MAX_WEBP_CHUNKS + 1} chunks or more besides its frames, "
    f"over the bound of {MAX_WEBP_CHUNKS}"
)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (riff(webp(exif=Image.Exif().tobytes())[12:] + UNKNOWN * (FLOOD_BYTES // 8)), CHUNKS_REASON),
        (riff(webp()[12:] + UNKNOWN * (FLOOD_BYTES // 8)), CHUNKS_REASON),
        (
            one_pixel_frames(FLOOD_BYTES // len(chunks_of(one_pixel_frames(1))[-1])),
            f"bad image: WebP has {MAX_WEBP_FRAMES + 1} frames or more, over the bound of {MAX_WEBP_FRAMES}",
        ),
    ],
    ids=["unknown-chunks-extended", "unknown-chunks-simple", "one-pixel-frames"],
)
def test_a_flood_of_chunks_is_refused(tmp_path: Path, data: bytes, reason: str) -> None:
    path = tmp_path / "flood.webp"
    path.write_bytes(data)
    result = measure(path, "WebPImagePlugin")
    assert result.get("reason") == reason, result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB, result


def test_at_the_bounds_a_webp_still_reads() -> None:
    animated = one_pixel_frames(MAX_WEBP_FRAMES)
    head, *rest = chunks_of(animated)
    unknown = MAX_WEBP_CHUNKS - (len(chunks_of(animated)) - MAX_WEBP_FRAMES)  # up to the bound
    data = riff(head + UNKNOWN * unknown + b"".join(rest))
    assert webp_layout_problem(data) is None
    assert load_image(data).size == (64, 64)
    assert webp_layout_problem(riff(head + UNKNOWN * (unknown + 1) + b"".join(rest))) == CHUNKS_REASON[11:]
    assert webp_layout_problem(riff(head + UNKNOWN * unknown + b"".join(rest) + rest[-1])) == (
        f"WebP has {MAX_WEBP_FRAMES + 1} frames or more, over the bound of {MAX_WEBP_FRAMES}"
    )


def test_chunks_past_the_riff_size_are_not_walked() -> None:
    """libwebp reads no further than the RIFF header's size; neither does the walk."""
    data = webp()
    assert webp_layout_problem(data + UNKNOWN * (2 * MAX_WEBP_CHUNKS)) is None


def test_bytes_that_are_not_a_webp_or_are_cut_short_are_left_to_pillow() -> None:
    data = riff(webp()[12:] + UNKNOWN * (2 * MAX_WEBP_CHUNKS))
    assert webp_layout_problem(b"RIFF\0\0\0\0WAVEfmt ") is None
    assert webp_layout_problem(data[:20]) is None
    assert webp_layout_problem(data[:2000]) is None


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 1  # orientation: upright
    exif[0x010F] = "a camera"
    return exif.tobytes()


_ICC = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (webp((640, 480), quality=80), (640, 480)),
        (webp((640, 480), lossless=True), (640, 480)),
        (webp((96, 64), exif=_exif(), icc_profile=_ICC), (96, 64)),
        (webp((32, 32), frames=3, duration=40, loop=0), (32, 32)),
        (webp((16, 16), frames=600, duration=40, loop=0, exif=_exif()), (16, 16)),
    ],
    ids=["lossy", "lossless", "exif-and-icc", "animated-3-frames", "animated-600-frames"],
)
def test_ordinary_webps_still_read(data: bytes, size: tuple[int, int]) -> None:
    assert webp_layout_problem(data) is None
    assert load_image(data).size == size
