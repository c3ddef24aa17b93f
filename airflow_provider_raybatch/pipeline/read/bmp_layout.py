"""A run-length encoded BMP's instructions, counted before Pillow decodes the file.

Pillow decodes RLE8 and RLE4 bitmaps in Python (``BmpRleDecoder``): a loop step per two-byte
instruction, one per pixel an end of line pads, and for RLE4 one per pixel it writes. An instruction
need not add a pixel: an encoded run past the end of its line is clipped to none, and a delta may move
by nothing. So a 31 MiB RLE8 file of 64x64 pixels, its first line full and then 16 Mi runs that add
nothing, took 6.9 s of CPU and still read as an image; 31 MiB of empty deltas took 5.6 s; a 147 KB RLE4
file of 4096x4096 pixels took 1.1 s and +134 MiB, for its decoder builds the pixels in a bytearray and
copies them before the image holds them. So this module walks the instructions itself, as Pillow's
decoder reads them (a step each, the data of absolute runs skipped), and names what no image has: more
instructions than its pixels and lines can use (each adds a pixel, but for one end of line a line and
the end of the bitmap), more than ``MAX_BMP_RLE_INSTRUCTIONS`` instructions, or more than
``MAX_BMP_RLE_PIXELS`` pixels. The walk stops at the bound, so a hostile file costs that many steps at
most. Uncompressed and bitfield BMPs are decoded in C and are not walked.
"""

from __future__ import annotations

import struct

#: Pixels of a run-length bitmap. Its decoder takes a Python step for each pixel an end of line pads
#: (and, for RLE4, each pixel it writes), and holds two copies of the pixels that the decode bound does
#: not count: at 2048x2048, about 0.3 s of CPU and 8 MiB. Run-length BMPs are old 16- and 256-colour
#: art (logos, installer banners); a large image is stored uncompressed or as PNG.
MAX_BMP_RLE_PIXELS = 4 * 1024 * 1024
#: Instructions of any RLE bitmap, a Python step of the walk and of Pillow's decoder each: an encoder
#: writes a run or an absolute block of up to 255 pixels per instruction and one end of line per line,
#: so a 16 Mi pixel image needs well under this unless it is noise written one pixel a run.
MAX_BMP_RLE_INSTRUCTIONS = 1024 * 1024

_FILE_HEADER_BYTES = 14  # "BM", file size, two reserved words, the offset of the bitmap data
#: Info headers Pillow reads width, height, bits and compression from (BITMAPINFOHEADER to V5); the
#: 12-byte OS/2 header has no compression field.
_INFO_HEADERS = frozenset({40, 52, 56, 64, 108, 124})
_INFO = struct.Struct("<iIIHHI")  # size, width, height, planes, bits, compression
_RLE8, _RLE4 = 1, 2
_PALETTE_ENTRY_BYTES = 4
_END_OF_LINE, _END_OF_BITMAP, _DELTA = 0, 1, 2


def bmp_layout_problem(data: bytes) -> str | None:
    """Why an RLE BMP's instructions would cost Pillow's Python decoder more than any image needs, or None.

    None also for bytes that are not a BMP (by Pillow's own test, ``BM``), for a BMP that is not run-length
    encoded, and for one too broken to walk: Pillow then refuses it itself at the cost of its header.
    """
    if not data.startswith(b"BM") or len(data) < _FILE_HEADER_BYTES + _INFO.size:
        return None
    header_size, width, height, _, bits, compression = _INFO.unpack_from(data, _FILE_HEADER_BYTES)
    if header_size not in _INFO_HEADERS or compression not in (_RLE8, _RLE4):
        return None
    if data[_FILE_HEADER_BYTES + 11] == 0xFF:  # a top-down bitmap: Pillow reads the height negated
        height = 2**32 - height
    kind = "RLE4" if compression == _RLE4 else "RLE8"
    if width * height > MAX_BMP_RLE_PIXELS:
        return (
            f"BMP of {width}x{height} pixels in {kind}, over the bound of {MAX_BMP_RLE_PIXELS} pixels for "
            "run-length data (Pillow decodes it in Python); store it uncompressed or as PNG"
        )
    if not width or not height:
        return None
    start = _data_start(data, header_size, bits)
    return _walk(data, start, width, height, kind)


def _data_start(data: bytes, header_size: int, bits: int) -> int:
    """Where Pillow's decoder starts: the file header's offset, past the palette where it points at it."""
    offset = int.from_bytes(data[10:14], "little")
    colors = int.from_bytes(data[_FILE_HEADER_BYTES + 32 : _FILE_HEADER_BYTES + 36], "little") or 1 << bits
    after_header = _FILE_HEADER_BYTES + header_size
    if offset == after_header and bits <= 8:
        return offset + _PALETTE_ENTRY_BYTES * colors
    # No offset: where Pillow's reading of the header left the file, past a palette it read.
    return offset or after_header + (_PALETTE_ENTRY_BYTES * colors if bits in (1, 4, 8) else 0)


def _walk(data: bytes, at: int, width: int, height: int, kind: str) -> str | None:
    """Step through the instructions as ``BmpRleDecoder.decode`` does, up to the bound."""
    pixels = width * height
    most = min(MAX_BMP_RLE_INSTRUCTIONS, pixels + height + 1)
    rle4 = kind == "RLE4"
    end, filled, x, steps = len(data), 0, 0, 0
    while filled < pixels and at + 2 <= end:
        count, byte = data[at], data[at + 1]
        at += 2
        steps += 1
        if steps > most:
            return (
                f"BMP's {kind} data has {steps} instructions or more for {width}x{height} pixels, over "
                f"the bound of {most} (one a pixel, one a line and an end, at most "
                f"{MAX_BMP_RLE_INSTRUCTIONS})"
            )
        if count:  # an encoded run, clipped at the end of its line
            added = max(0, min(count, width - x))
            filled, x = filled + added, x + added
        elif byte == _END_OF_LINE:
            filled, x = -(-filled // width) * width, 0
        elif byte == _END_OF_BITMAP:
            return None
        elif byte == _DELTA:
            if at + 2 > end:
                return None
            filled += min(pixels - filled, data[at] + data[at + 1] * width)
            x, at = filled % width, at + 2
        else:  # an absolute block of ``byte`` pixels, padded to a whole word of the file
            added = min(pixels - filled, byte)
            size = (added + 1) // 2 if rle4 else added
            if at + size > end:
                return None
            filled, x, at = filled + added, x + byte, at + size
            if filled == pixels:
                return None
            at += at % 2
    return None
