"""A PNG's chunks, counted before Pillow opens the file.

Pillow handles each chunk in Python and bounds only what one chunk may inflate to: an iCCP profile
of 1 KiB that inflates to just under its 1 MiB limit costs 7 ms, so a file of a thousand of them
(1 MiB) took 6.6 s of CPU; empty private chunks are kept in a list (31 MiB of them grew the process
by 622 MiB in 25 s); and empty text chunks cost 3.5 s per 8 MiB. So this module walks the chunk list
itself, reading each chunk's length and type and never its data, and names what no image has: more
than ``MAX_PNG_CHUNKS`` chunks that are not image data, or more than one iCCP profile. IDAT and an
APNG's fdAT chunks are pixel data, which an encoder may split as it likes (libpng: 8 KiB a chunk), and
what they inflate to is held by the decode bound; but Pillow checks each one's CRC in Python, so 31 MiB
of empty IDATs took 7.2 s: they may average no less than ``MIN_DATA_CHUNK_BYTES`` each. An eXIf chunk
over :data:`.exif_bound.MAX_EXIF_BYTES` is refused here, before Pillow copies it (:mod:`.exif_bound`).
"""

from __future__ import annotations

import struct

from airflow_provider_raybatch.pipeline.read.exif_bound import MAX_EXIF_BYTES

#: Chunks other than IDAT and fdAT one PNG may hold. A PNG has a handful (header, palette,
#: transparency, text, ICC profile, EXIF, end); an APNG adds one fcTL a frame, so this admits
#: animations of up to about 990 frames, of which only the first is read.
MAX_PNG_CHUNKS = 1000
#: The PNG specification allows one ICC profile, and Pillow inflates each one it finds.
MAX_PNG_ICCP = 1
#: What a file's image data chunks take on average at least, once it has more than MAX_PNG_CHUNKS of
#: them: 31 MiB of them then cost Pillow a third of a second.
MIN_DATA_CHUNK_BYTES = 256

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_HEAD = struct.Struct(">I4s")  # length, type; then the data and a 4-byte CRC
_PIXEL_DATA = frozenset({b"IDAT", b"fdAT"})


def png_layout_problem(data: bytes) -> str | None:
    """Why a PNG's chunks would cost Pillow more than any image needs, or None.

    None also for bytes that are not a PNG, and for a PNG cut short: Pillow then refuses it itself,
    having read no more chunks than the walk did. The walk ends at IEND, where Pillow stops.
    """
    if not data.startswith(_SIGNATURE):
        return None
    at, chunks, profiles, pixel_chunks = len(_SIGNATURE), 0, 0, 0
    most_pixel_chunks = max(MAX_PNG_CHUNKS, len(data) // MIN_DATA_CHUNK_BYTES)
    while at + _HEAD.size <= len(data):
        length, kind = _HEAD.unpack_from(data, at)
        at += _HEAD.size + length + 4
        if kind in _PIXEL_DATA:
            pixel_chunks += 1
            if pixel_chunks > most_pixel_chunks:
                return (
                    f"PNG has {pixel_chunks} image data chunks or more, over the bound of "
                    f"{most_pixel_chunks} (one for every {MIN_DATA_CHUNK_BYTES} bytes of the file)"
                )
            continue
        if kind == b"IEND":
            return None
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            return (
                f"PNG has {chunks} chunks or more besides its image data, over the bound of {MAX_PNG_CHUNKS}"
            )
        if kind == b"eXIf" and length > MAX_EXIF_BYTES:
            return f"PNG's eXIf chunk holds {length} bytes, over the bound of {MAX_EXIF_BYTES} for EXIF"
        if kind == b"iCCP":
            profiles += 1
            if profiles > MAX_PNG_ICCP:
                return f"PNG has {profiles} iCCP chunks or more, over the bound of {MAX_PNG_ICCP}"
    return None
