"""A JPEG's marker segments and scans, counted before Pillow opens the file.

Pillow bounds neither. libjpeg folds every scan of a progressive JPEG into its coefficients for the
whole image, so a scan of a few dozen bytes costs milliseconds: a 4096x4096 JPEG whose last scan is
repeated 10,000 times before the end marker is a 0.41 MiB file that took 112 s of CPU. Before the
first scan, Pillow reads the file in Python, a marker at a time: it keeps every APP and COM segment
in a list (31 MiB of empty 4-byte segments grew the process by 2.1 GiB in 37 s) and steps over stray
bytes and 0xFF fill one byte at a time (8 MiB of fill: 10 s). So this module walks the segments
itself, reading each one's length and never its contents, and names what no image has: more than
``MAX_JPEG_SCANS`` scans, ``MAX_JPEG_MARKERS`` markers or ``MAX_JPEG_STRAY_BYTES`` bytes between
segments. The entropy-coded data after each scan's header is skipped by a regular expression that
finds the next marker, so the walk costs a pass in C over the file and a Python step per segment.
Pillow also joins every APP1 Exif segment into one EXIF block, copying what it has joined for each one
(14 MB of them: 5.9 s and +1,289 MiB), so their bytes together may be no more than
:data:`.exif_bound.MAX_EXIF_BYTES`, what one segment holds (:mod:`.exif_bound`).
"""

from __future__ import annotations

import re

from airflow_provider_raybatch.pipeline.read.exif_bound import EXIF_PREFIX, MAX_EXIF_BYTES

#: Scans (SOS markers) one JPEG may hold. libjpeg's progressive script has 10 for a colour image
#: (6 for grey), and scripts that split the coefficient bands further stay in the dozens. At 100, a
#: 6144x6144 JPEG (about the largest progressive one ``max_decode_bytes`` admits) took 3.0 s of CPU
#: where its 10 real scans took 0.3 s.
MAX_JPEG_SCANS = 100
#: Markers of any kind, with or without a segment: a photo has a few dozen (tables, EXIF, an ICC
#: profile or XMP split into 64 KiB APP segments); Pillow keeps each APP and COM segment as an object,
#: and each marker is a step of the walk in Python.
MAX_JPEG_MARKERS = 1000
#: Bytes between one segment's end and the next marker (stray bytes and 0xFF fill), all together:
#: encoders write none, and Pillow steps over each in Python.
MAX_JPEG_STRAY_BYTES = 1024

#: A marker: 0xFF and a code that is not a stuffed zero, a restart (RST0-7, inside entropy-coded
#: data) or more fill. Searching for it skips a scan's data in one call.
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_SOI, _EOI, _SOS, _TEM, _APP1 = 0xD8, 0xD9, 0xDA, 0x01, 0xE1


def jpeg_layout_problem(data: bytes) -> str | None:
    """Why a JPEG's segments would cost Pillow or libjpeg more than any image needs, or None.

    None also for bytes that are not a JPEG (by Pillow's own test, ``FF D8 FF``), and for a JPEG cut
    short or too broken to walk: Pillow then refuses it or reads what there is, at a cost bounded by
    what the walk saw. The walk ends at the first end-of-image marker, where libjpeg stops.
    """
    if not data.startswith(b"\xff\xd8\xff"):
        return None
    at, scans, markers, stray, in_scan, exif = 2, 0, 0, 0, False, 0
    while True:
        found = _MARKER.search(data, at)
        if found is None:
            return None
        if not in_scan:  # after a scan's header, everything up to the next marker is its data
            stray += found.start() - at
            if stray > MAX_JPEG_STRAY_BYTES:
                return (
                    f"JPEG has {stray} stray bytes between its segments (before byte {found.start()}), "
                    f"over the bound of {MAX_JPEG_STRAY_BYTES}"
                )
        code, at = data[found.start() + 1], found.end()
        if code == _EOI:
            return None
        markers += 1
        if markers > MAX_JPEG_MARKERS:
            return f"JPEG has {markers} markers or more, over the bound of {MAX_JPEG_MARKERS}"
        if code in (_SOI, _TEM):  # no length follows
            in_scan = False
            continue
        if code == _SOS:
            scans += 1
            if scans > MAX_JPEG_SCANS:
                return f"JPEG has {scans} scans (SOS markers) or more, over the bound of {MAX_JPEG_SCANS}"
        length = int.from_bytes(data[at : at + 2], "big")
        if length < 2:
            return None  # a segment shorter than its own length field: libjpeg refuses it
        if code == _APP1 and data.startswith(EXIF_PREFIX, at + 2):
            exif += length - 2 - len(EXIF_PREFIX)
            if exif > MAX_EXIF_BYTES:
                return (
                    f"JPEG's APP1 Exif segments hold {exif} bytes or more, over the bound of {MAX_EXIF_BYTES}"
                )
        at += length
        in_scan = code == _SOS
