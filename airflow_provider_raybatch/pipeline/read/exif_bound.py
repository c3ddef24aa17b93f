"""The EXIF block Pillow would parse, bounded before it parses it.

Reading an image's orientation, Pillow parses the EXIF block whole, an N-tuple for each array of N
values, and applying it (``ImageOps.exif_transpose``) writes the block out again: a 28 MB PNG whose
eXIf chunk holds one array of 7 M LONGs, with orientation 6, grew the reading process by 1,259 MiB in
4.9 s and read as a 64x64 image; the same array of SHORTs in a WebP's EXIF chunk, 1,238 MiB. A JPEG
holds its EXIF in a 64 KiB APP1 segment, but Pillow joins every such segment, and takes a PNG's eXIf
chunk, its ``exif`` text chunk or its ``Raw profile type exif`` hex text, and a WebP's EXIF chunk, at
any size. So the block Pillow found is measured where it will look for it (``info``), whatever the
container, and one over ``MAX_EXIF_BYTES`` fails the image. A TIFF's own tags are walked by
:mod:`.tiff_layout`.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Bytes of EXIF one image may carry: what one JPEG APP1 segment holds, as cameras write it (tags, maker
#: notes and a thumbnail together). Pillow parses a block of this size in a few milliseconds.
MAX_EXIF_BYTES = 64 * 1024

#: What a JPEG's APP1 segment starts with, and what Pillow puts before a PNG's or WebP's block.
EXIF_PREFIX = b"Exif\x00\x00"
_HEX_TEXT = "Raw profile type exif"  # ImageMagick's PNG text chunk: a header line, then hex digits


def exif_problem(info: Mapping[str | tuple[int, int], object]) -> str | None:  # Pillow's Image.info
    """Why the EXIF an opened image's ``info`` carries is more than Pillow should parse, or None.

    Sizes are of the TIFF structure Pillow parses, without the ``Exif`` prefix a container may add.
    """
    block = info.get("exif")
    if isinstance(block, bytes | str):
        size = len(block) - (
            len(EXIF_PREFIX) if isinstance(block, bytes) and block.startswith(EXIF_PREFIX) else 0
        )
        if size > MAX_EXIF_BYTES:
            return f"EXIF of {size} bytes, over the bound of {MAX_EXIF_BYTES}; strip or shrink its metadata"
        return None
    text = info.get(_HEX_TEXT)
    if isinstance(text, str):
        size = (len(text) - text.count("\n")) // 2  # hex digits, two a byte, in lines
        if size > MAX_EXIF_BYTES:
            return (
                f"EXIF of about {size} bytes (as {_HEX_TEXT!r} text), over the bound of {MAX_EXIF_BYTES}; "
                "strip or shrink its metadata"
            )
    return None
