"""A GIF's blocks before its first image are counted before Pillow opens it.

Row data is untrusted (docs/security.md). Opening a GIF, Pillow reads every block before the first
image descriptor in Python, a sub-block at a time, keeps each comment sub-block as an object, and steps
over bytes that start no block one at a time. pipeline/read/gif_layout.py walks those blocks first and
refuses more than MAX_GIF_EXTENSIONS extension blocks, MAX_GIF_SUB_BLOCKS sub-blocks or
MAX_GIF_STRAY_BYTES stray bytes before the first image, as the row's ``bad image``.

Measured on a shared 2-core machine with files of just under 32 MiB that each read as a 64x64 image,
before the walk -> after: one-byte comment extensions 12.9 s and +1,155 MiB -> 0.001 s and +0 MiB; one
comment of one-byte sub-blocks 11.7 s and +1,450 MiB -> 0.004 s; empty comments 9.2 s -> 0.001 s;
graphic control extensions 9.3 s -> 0.002 s; stray bytes 10.7 s -> 0.001 s. 32 MiB of comments after
the first image cost 0.04 s before and after: Pillow reads a later frame's blocks only to seek, which
the reader never does. The hostile files are made here (bytes) from a GIF Pillow wrote; CPU and growth
are measured in a fresh interpreter.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read.gif_layout import (  # noqa: E402 - after the skip
    MAX_GIF_EXTENSIONS,
    MAX_GIF_STRAY_BYTES,
    MAX_GIF_SUB_BLOCKS,
    gif_layout_problem,
)
from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402

#: Hostile files are this big: before the walk, Pillow took 2-3 s of CPU for each.
FLOOD_BYTES = 8 << 20


def gif(size: tuple[int, int] = (64, 64), frames: int = 1, **save: Any) -> bytes:  # Any: save options.
    images = [
        Image.linear_gradient("L").resize(size).point(lambda value, i=index: (value + i) % 256).convert("P")
        for index in range(frames)
    ]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=frames > 1, append_images=images[1:], **save)
    return buffer.getvalue()


def before_first_image(inserted: bytes, data: bytes | None = None) -> bytes:
    """A GIF with ``inserted`` after its global color table, where Pillow reads each block as it opens."""
    data = gif() if data is None else data
    flags = data[10]
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    return data[:at] + inserted + data[at:]


def repeated(unit: bytes, nbytes: int = FLOOD_BYTES) -> bytes:
    return unit * (nbytes // len(unit))


EXTENSIONS_REASON = (
    f"bad image: GIF has {MAX_GIF_EXTENSIONS + 1} extension blocks or more before its first image, "
    f"over the bound of {MAX_GIF_EXTENSIONS}"
)
SUB_BLOCKS_REASON = (
    f"bad image: GIF has {MAX_GIF_SUB_BLOCKS + 1} extension sub-blocks or more before its first image, "
    f"over the bound of {MAX_GIF_SUB_BLOCKS}"
)
STRAY_REASON = (
    f"bad image: GIF has {MAX_GIF_STRAY_BYTES + 1} stray bytes or more before its first image, "
    f"over the bound of {MAX_GIF_STRAY_BYTES}"
)


@pytest.mark.parametrize(
    ("flood", "reason"),
    [
        (repeated(b"\x21\xfe\x01x\x00"), EXTENSIONS_REASON),  # one-byte comments
        (b"\x21\xfe" + repeated(b"\x01x") + b"\x00", SUB_BLOCKS_REASON),  # one comment, one-byte sub-blocks
        (repeated(b"\x21\xfe\x00"), EXTENSIONS_REASON),  # empty comments
        (repeated(b"\x21\xf9\x04\x00\x00\x00\x00\x00"), EXTENSIONS_REASON),  # graphic control extensions
        (bytes(FLOOD_BYTES), STRAY_REASON),  # bytes that start no block
    ],
    ids=["one-byte-comments", "comment-sub-blocks", "empty-comments", "graphic-control", "stray-bytes"],
)
def test_a_flood_of_blocks_before_the_first_image_is_refused(
    tmp_path: Path, flood: bytes, reason: str
) -> None:
    path = tmp_path / "flood.gif"
    path.write_bytes(before_first_image(flood))
    result = measure(path, "GifImagePlugin")
    assert result.get("reason") == reason, result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB, result


def test_blocks_after_the_first_image_are_not_walked(tmp_path: Path) -> None:
    """The reader decodes the first frame only; Pillow reads what follows only when asked to seek."""
    data = gif()
    path = tmp_path / "after.gif"
    path.write_bytes(data[:-1] + repeated(b"\x21\xfe\x01x\x00") + b";")
    assert gif_layout_problem(path.read_bytes()) is None
    result = measure(path, "GifImagePlugin")
    assert result.get("size") == [64, 64], result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result


def test_the_walk_reads_sub_blocks_as_pillow_does() -> None:
    """Pillow reads on after an extension other than a comment whose first sub-block is empty: the
    sub-blocks that follow are that extension's, and counted as such, not as stray bytes."""
    hidden = b"\x21\xf9\x00" + b"\x01x" * MAX_GIF_SUB_BLOCKS + b"\x00"
    assert gif_layout_problem(before_first_image(hidden)) is None
    assert load_image(before_first_image(hidden)).size == (64, 64)
    over = b"\x21\xf9\x00" + b"\x01x" * (MAX_GIF_SUB_BLOCKS + 1) + b"\x00"
    assert f"bad image: {gif_layout_problem(before_first_image(over))}" == SUB_BLOCKS_REASON


def test_at_the_bounds_a_gif_still_reads() -> None:
    data = before_first_image(
        b"\x21\xfe"
        + b"\x01x" * (MAX_GIF_SUB_BLOCKS - MAX_GIF_EXTENSIONS + 1)
        + b"\x00"
        + b"\x21\xfe\x01x\x00" * (MAX_GIF_EXTENSIONS - 1)
        + bytes(MAX_GIF_STRAY_BYTES)
    )
    assert gif_layout_problem(data) is None
    assert load_image(data).size == (64, 64)


def test_bytes_that_are_not_a_gif_or_are_cut_short_are_left_to_pillow() -> None:
    data = before_first_image(repeated(b"\x21\xfe\x00"))
    assert gif_layout_problem(b"\x89PNG\r\n\x1a\n") is None
    assert gif_layout_problem(data[:12]) is None
    assert gif_layout_problem(data[:800]) is None
    assert gif_layout_problem(gif()[:-30]) is None


def _with_xmp(data: bytes) -> bytes:
    """An XMP application extension as Adobe writes it: the packet's bytes read as sub-block lengths,
    then a 258-byte trailer that counts down so that any reader ends at its zero."""
    packet = b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?>' + b"<x:xmpmeta>" * 300 + b"<?xpacket end?>"
    trailer = b"\x01" + bytes(range(255, -1, -1)) + b"\x00"
    return before_first_image(b"\x21\xff\x0bXMP DataXMP" + packet + trailer, data)


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (gif((640, 480)), (640, 480)),
        (gif((96, 64), comment=b"a comment " * 100), (96, 64)),
        (before_first_image(b"\x21\xfe" + b"\xff" + b"c" * 255 + b"\x02hi\x00", gif()), (64, 64)),
        (_with_xmp(gif()), (64, 64)),
        (gif((32, 32), frames=3, duration=40, loop=0), (32, 32)),
        (gif((16, 16), frames=600, duration=40, loop=0, comment=b"many frames"), (16, 16)),
    ],
    ids=["global-palette", "comment", "long-comment", "xmp", "animated-3-frames", "animated-600-frames"],
)
def test_ordinary_gifs_still_read(data: bytes, size: tuple[int, int]) -> None:
    assert data[10] & 0x80  # Pillow writes a global color table
    assert gif_layout_problem(data) is None
    assert load_image(data).size == size
