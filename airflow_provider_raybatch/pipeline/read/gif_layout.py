"""A GIF's blocks before its first image, counted before Pillow opens the file.

Opening a GIF, Pillow reads every block before the first image descriptor in Python, a sub-block at a
time, and keeps each comment sub-block as a bytes object in a list: 32 MiB of one-byte comment
extensions grew the reading process by 1,155 MiB in 12.9 s, one comment of one-byte sub-blocks by 1,450
MiB in 11.7 s, and 32 MiB of empty comments or graphic control extensions cost 9.2 s and 9.3 s. Bytes
that start no block are stepped over one at a time: 32 MiB of them, 10.7 s. So this module walks those
blocks itself, reading each sub-block's length byte and never its data, as Pillow's parser reads them,
and names what no image has: more than ``MAX_GIF_EXTENSIONS`` extension blocks, ``MAX_GIF_SUB_BLOCKS``
sub-blocks or ``MAX_GIF_STRAY_BYTES`` stray bytes before the first image. The walk ends at the first
image descriptor: the reader decodes the first frame only, and Pillow reads a later frame's blocks only
when asked to seek, or for ``n_frames`` and ``is_animated``, which the reader never asks.
"""

from __future__ import annotations

#: Extension blocks before the first image. A GIF has a few: a graphic control extension, a NETSCAPE
#: looping block, perhaps a comment and an XMP packet. Each is a step of Pillow's parser in Python.
MAX_GIF_EXTENSIONS = 1000
#: Data sub-blocks of those extensions, all together. An encoder fills each with up to 255 bytes, so
#: this admits 2.5 MB of comments; an XMP packet, whose bytes are read as sub-block lengths, and its
#: 257-byte trailer take a few hundred to a few thousand. Pillow keeps each comment sub-block as an
#: object: a GIF at all three bounds reads in 0.07 s of CPU.
MAX_GIF_SUB_BLOCKS = 10_000
#: Bytes that start no block (not ``!``, ``,`` or ``;``): encoders write none, and Pillow steps over
#: each in Python.
MAX_GIF_STRAY_BYTES = 1024

_HEADER_BYTES = 13  # signature and version, logical screen descriptor
_EXTENSION, _IMAGE, _TRAILER = 0x21, 0x2C, 0x3B
_COMMENT, _APPLICATION = 0xFE, 0xFF
_NETSCAPE = b"NETSCAPE2.0"


class _Walk:
    """Where the walk is in the file, and what it has counted so far."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at
        self.extensions = self.sub_blocks = self.stray = 0

    def sub_block(self) -> bytes | None:
        """The next sub-block's data, as Pillow's ``GifImageFile.data`` reads it: None at a zero length
        byte or the end of the file. Its data is sliced only where the parser looks into it."""
        if self.at >= len(self.data):
            return None
        length = self.data[self.at]
        self.at += 1
        if not length:
            return None
        self.sub_blocks += 1
        start, self.at = self.at, self.at + length
        return self.data[start : start + min(length, len(_NETSCAPE))]

    def problem(self) -> str | None:
        if self.extensions > MAX_GIF_EXTENSIONS:
            return (
                f"GIF has {self.extensions} extension blocks or more before its first image, "
                f"over the bound of {MAX_GIF_EXTENSIONS}"
            )
        if self.sub_blocks > MAX_GIF_SUB_BLOCKS:
            return (
                f"GIF has {self.sub_blocks} extension sub-blocks or more before its first image, "
                f"over the bound of {MAX_GIF_SUB_BLOCKS}"
            )
        if self.stray > MAX_GIF_STRAY_BYTES:
            return (
                f"GIF has {self.stray} stray bytes or more before its first image, "
                f"over the bound of {MAX_GIF_STRAY_BYTES}"
            )
        return None


def gif_layout_problem(data: bytes) -> str | None:
    """Why the blocks before a GIF's first image would cost Pillow more than any image needs, or None.

    None also for bytes that are not a GIF (by Pillow's own test, ``GIF87a`` or ``GIF89a``), and for a
    GIF cut short or with no image: Pillow then refuses it itself, having read no more than the walk.
    """
    if not data.startswith((b"GIF87a", b"GIF89a")) or len(data) < _HEADER_BYTES:
        return None
    flags = data[10]
    at = _HEADER_BYTES + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # the global color table
    walk = _Walk(data, at)
    while walk.at < len(data):
        introducer = data[walk.at]
        walk.at += 1
        if introducer in (_IMAGE, _TRAILER):
            return None
        if introducer == _EXTENSION:
            walk.extensions += 1
            _extension(walk)
        else:
            walk.stray += 1
        problem = walk.problem()
        if problem:
            return problem
    return None


def _extension(walk: _Walk) -> None:
    """Step over one extension's label and sub-blocks as Pillow does, or until a bound is passed.

    Pillow reads a comment's sub-blocks up to its terminator; for any other label it reads the first
    sub-block (and a NETSCAPE block's second) and then sub-blocks up to a zero length, so an empty
    first sub-block makes it read on into what follows. The walk reads the same bytes as lengths.
    """
    if walk.at >= len(walk.data):
        return
    label = walk.data[walk.at]
    walk.at += 1
    first = walk.sub_block()
    if label == _COMMENT and first is None:
        return
    if label == _APPLICATION and first is not None and first.startswith(_NETSCAPE):
        walk.sub_block()
    while walk.sub_block() is not None:
        if walk.sub_blocks > MAX_GIF_SUB_BLOCKS:
            return
