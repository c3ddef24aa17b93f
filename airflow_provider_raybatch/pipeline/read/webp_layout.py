"""A WebP's RIFF chunks, counted before Pillow opens the file.

Pillow opens every WebP with libwebp's animation decoder, whose demuxer parses the whole file at once
and keeps an entry for each chunk it does not know and each animation frame (ANMF): 32 MiB of 4 Mi
empty unknown chunks grew the reading process by 354 MiB in 1.2 s, and 32 MiB of one-pixel frames by
231 MiB, before any size of ours can be checked. So this module walks the RIFF chunk list itself,
reading each chunk's fourcc and length and never its data, and names what no image has: more than
``MAX_WEBP_CHUNKS`` chunks besides the frames, more than ``MAX_WEBP_FRAMES`` frames, or an EXIF chunk
over :data:`.exif_bound.MAX_EXIF_BYTES` (:mod:`.exif_bound`). The walk stops at the bound, so a hostile
file costs a few thousand steps at most.
"""

from __future__ import annotations

import struct

from airflow_provider_raybatch.pipeline.read.exif_bound import MAX_EXIF_BYTES

#: Chunks other than ANMF frames one WebP may hold: a still image has one to five (VP8X, ICCP, ANIM,
#: ALPH, VP8 or VP8L, EXIF, XMP); the demuxer keeps one entry for each.
MAX_WEBP_CHUNKS = 1000
#: ANMF frames: one a frame. The demuxer keeps about 50 bytes for each and decodes none at open, and
#: the reader decodes the first only; this admits animations of 40 s at 25 frames a second, and a
#: WebP of 1,000 frames reads in 0.05 s of CPU.
MAX_WEBP_FRAMES = 1000

_HEAD = struct.Struct("<4sI")  # fourcc, payload size; the payload is padded to an even length
_RIFF_HEADER_BYTES = 12  # "RIFF", the size of what follows, "WEBP"
#: The first chunks Pillow accepts a WebP by (its ``_accept``): lossy, extended, lossless.
_FIRST_CHUNKS = (b"VP8 ", b"VP8X", b"VP8L")


def webp_layout_problem(data: bytes) -> str | None:
    """Why a WebP's chunks would cost libwebp's demuxer more than any image needs, or None.

    None also for bytes Pillow would not open as a WebP, and for a WebP cut short: libwebp then
    refuses it itself. The walk ends where the RIFF header says the file ends, as libwebp's does.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or data[12:16] not in _FIRST_CHUNKS:
        return None
    riff_size = int.from_bytes(data[4:8], "little")
    end = min(len(data), _RIFF_HEADER_BYTES - 4 + riff_size)
    at, chunks, frames = _RIFF_HEADER_BYTES, 0, 0
    while at + _HEAD.size <= end:
        fourcc, size = _HEAD.unpack_from(data, at)
        at += _HEAD.size + size + (size & 1)
        if fourcc == b"ANMF":
            frames += 1
            if frames > MAX_WEBP_FRAMES:
                return f"WebP has {frames} frames or more, over the bound of {MAX_WEBP_FRAMES}"
            continue
        if fourcc == b"EXIF" and size > MAX_EXIF_BYTES:
            return f"WebP's EXIF chunk holds {size} bytes, over the bound of {MAX_EXIF_BYTES}"
        chunks += 1
        if chunks > MAX_WEBP_CHUNKS:
            return f"WebP has {chunks} chunks or more besides its frames, over the bound of {MAX_WEBP_CHUNKS}"
    return None
