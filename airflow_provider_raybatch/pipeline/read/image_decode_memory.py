"""What decoding an image holds at once, counted from its header before a pixel is decoded.

A file of a few hundred KB may declare 64 Mi pixels, and each step after the decoder (the EXIF
rotation, the composite over white, the RGB conversion, the resize) makes a full-size copy: checked
against max_pixels alone, an 8192x8192 RGBA PNG of 260 KB grew a worker by 1 GiB. So the bytes
every step holds are counted from the header, before a pixel is decoded, and the order is chosen
that fits max_decode_bytes: first the one that has always given these pixels (rotate, convert,
resize); then a JPEG decoded at a reduced scale (libjpeg's DCT scaling, never below the output
size); then shrinking first, before the rotation and the conversion, where the output is smaller;
else the image is refused, with the size that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image


#: Bytes a pixel takes in Pillow's memory, by mode; any other mode takes 4 (Pillow stores RGB, LA,
#: CMYK and 32-bit modes in 4 bytes a pixel, not packed).
_STORED_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
#: Modes Pillow resizes with the filter asked (it resizes "P" and "1" with NEAREST): others are
#: converted to RGB(A) before a shrink-first resize.
RESIZABLE = ("L", "RGB", "RGBA", "LA")
#: Pillow opens a JPEG that carries multi-picture data as "MPO": the same decoder.
JPEG_FORMATS = ("JPEG", "MPO")
#: EXIF orientations that exif_transpose applies, and those that swap width and height.
ROTATED = frozenset(range(2, 9))
SWAPPED = frozenset(range(5, 9))


@dataclass(frozen=True)
class DecodeFacts:
    """What an opened image's header tells about the memory decoding it takes."""

    size: tuple[int, int]
    mode: str
    alpha: bool
    orientation: int | None  # EXIF orientation; None: only decoding would tell (see _orientation)
    decoder_bytes: int  # what the decoder holds beside the pixels while it decodes
    pinned: bool  # the caller holds the image (a preprocess's), so its pixels are never freed here

    @property
    def oriented(self) -> tuple[int, int]:
        return oriented(self.size, self.orientation)


def decode_facts(image: Image, pinned: bool) -> DecodeFacts:
    width, height = image.size
    source = width * height * _STORED_BYTES.get(image.mode, 4)
    decoder_bytes = 0
    if not is_decoded(image):
        if image.format in JPEG_FORMATS and image.info.get("progressive"):
            decoder_bytes = 2 * _jpeg_samples(image)  # every coefficient, held whole at any scale
        elif image.format == "TIFF":
            decoder_bytes = source  # a whole strip or tile is decoded to a buffer, then copied
        elif image.format == "WEBP":
            decoder_bytes = 13 * width * height  # libwebp's canvases and YUV planes, and Pillow's copy
    return DecodeFacts(image.size, image.mode, has_alpha(image), _orientation(image), decoder_bytes, pinned)


def is_decoded(image: Image) -> bool:
    # Pillow keeps the pixels in ``_im``, None until they are decoded (a WebP sets no ``tile`` before).
    return getattr(image, "_im", None) is not None


def _jpeg_samples(image: Image) -> int:
    """The DCT samples of a JPEG's components at full size, with a margin for its padded MCUs."""
    width, height = image.size
    layers = getattr(image, "layer", None) or [("", 1, 1, 0)] * 4
    h_max, v_max = max(layer[1] for layer in layers), max(layer[2] for layer in layers)
    padded = (width + 16 * h_max) * (height + 16 * v_max)
    return sum(padded * layer[1] * layer[2] // (h_max * v_max) for layer in layers)


def _orientation(image: Image) -> int | None:
    """The EXIF orientation (1 upright), or None where only decoding would tell it.

    Pillow finds a PNG's eXIf chunk after the pixels by decoding them: asking before the decode would
    decode the image before its size is checked.
    """
    if not is_decoded(image) and image.format == "PNG" and "exif" not in image.info:
        return None
    orientation = image.getexif().get(0x0112, 1)
    return orientation if isinstance(orientation, int) else 1


def oriented(size: tuple[int, int], orientation: int | None) -> tuple[int, int]:
    return (size[1], size[0]) if orientation in SWAPPED else size


def peak_bytes(facts: DecodeFacts, target: tuple[int, int], shrink_first: bool) -> int:
    """The most bytes the steps hold at once for an image of ``facts`` made ``target`` (upright)."""
    width, height = facts.size
    pixels = width * height
    source = pixels * _STORED_BYTES.get(facts.mode, 4)
    full, out = 4 * pixels, 4 * target[0] * target[1]  # an RGB or RGBA copy, the input's and the output's
    between = 4 * max(
        target[0] * height, target[1] * width
    )  # resize's first pass (output width x input height)
    steps: list[tuple[int, int]] = []  # (what a step makes, what it holds only while it runs)
    if shrink_first:
        premultiplied = source if facts.mode in ("RGBA", "LA") else 0  # Pillow resizes alpha premultiplied
        if facts.mode not in RESIZABLE:
            steps.append((full, 0))
            premultiplied = full if facts.alpha else 0
        steps.append((out, premultiplied + between + out))
        steps.append((out, 3 * out))  # rotated and composited over white at the output's size
    else:
        if facts.orientation is None or facts.orientation in ROTATED:
            # A preprocess's image is copied; ours is rotated in place, its old pixels freed after.
            steps.append((source, 0) if facts.pinned else (0, source))
        if facts.alpha:
            steps.append((full, (0 if facts.mode == "RGBA" else full) + full))  # RGBA, white, composite
        elif facts.mode != "RGB":
            steps.append((full, 0))
        if target != facts.oriented:
            steps.append((out, between))
    # The source stays until the end (the callers hold it); a step holds the copy it works on, its
    # scratch and what it makes, and then only what it made.
    peak, held = source + facts.decoder_bytes, 0
    for made, scratch in steps:
        peak = max(peak, source + held + scratch + made)
        held = made or held
    return peak


def has_alpha(image: Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)


def smaller(size: tuple[int, int], bound: tuple[int, int]) -> tuple[int, int]:
    return (max(1, min(size[0], bound[0])), max(1, min(size[1], bound[1])))
