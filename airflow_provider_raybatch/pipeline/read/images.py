"""Turn one row's image value into a validated image for a vision-language model, or say why not.

A row's image may be a Hugging Face image struct (``{"bytes": b"...", "path": ...}`` as image
datasets store it in Parquet), raw bytes, a ``data:image/...;base64,`` URL, a local path, a
``file://`` / ``s3://`` URI, an ``http(s)://`` URL or, in messages a preprocess returns, a PIL image.
Paths and URLs are read by :mod:`.image_sources`, within the job's policy of where images may come
from (``ImageOptions.sources``: public http(s) addresses, the input folder, the input's S3 folder,
and what the spec's ``image_allowed_*`` fields add). :func:`load_image` reads it, checks it with
Pillow (identify, verify, decode, size limits), applies the EXIF orientation, converts it to RGB
(transparent pixels over white) and resizes it to bound the vision-token budget.

A bad value raises ``ValueError`` whose text is the row's error reason, ``"<kind>: <detail>"`` with
one of the ``*_KIND`` constants, the convention :mod:`.prompts` uses (``run.py`` turns it into an
error row). Nothing a row holds makes these functions raise anything else: a failing fetch, decoder
or encoder becomes the row's reason.

What the engine gets: :func:`image_content_part` returns an OpenAI-style content part
``{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}``. A data URL, not a PIL
image or bytes, because the pipeline carries each row's messages as JSON text through Ray Data;
vLLM's chat parser (which ``ray.data.llm``'s prepare-multimodal stage calls) decodes data URLs itself,
with no network and no ``allowed_local_media_path``, and has no content part for raw bytes.
:func:`split_image_parts` turns such messages into the placeholder messages plus decoded images
that ``vllm.LLM.generate`` / ray.data.llm's engine stage take as ``multi_modal_data``, for when the
prepare-multimodal stage cannot be used. :func:`normalize_message_images` gives messages with
images in any form Ray Data LLM takes the same canonical parts.

The size of what the engine gets is bounded where the row is prepared, so that a big photo fails
(or is shrunk) as its own row and never later, outside any row's handler: with no ``size`` or
``max_side`` an image is shrunk to at most ``DEFAULT_MAX_OUTPUT_PIXELS`` (4 Mi pixels, e.g.
2048x2048 or 2364x1773); a JPEG is re-encoded as JPEG (a PNG of a photo is 5-10 times bigger and
no better), anything else as PNG (lossless: text in a screenshot stays sharp), falling back to JPEG
when the PNG is over ``max_output_bytes``; an encoding still over ``max_output_bytes`` (16 MiB by
default) fails the row with ``image too large``. :func:`split_image_parts` accepts up to
``PART_MAX_BYTES`` and ``PART_MAX_PIXELS``, which no option can exceed.

Pillow is imported lazily: the module imports on a machine without it (the Airflow side).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from airflow_provider_raybatch.pipeline.read.bmp_layout import bmp_layout_problem
from airflow_provider_raybatch.pipeline.read.exif_bound import exif_problem
from airflow_provider_raybatch.pipeline.read.gif_layout import gif_layout_problem

# The kinds of reading a row's image come from image_sources, with ImageError; they are named here
# too, beside the kinds of decoding, for the readers of rows' reasons (TOO_LARGE_KIND also covers
# pixels and the engine's encoding here).
from airflow_provider_raybatch.pipeline.read.image_decode_memory import (
    JPEG_FORMATS,
    RESIZABLE,
    ROTATED,
    DecodeFacts,
    decode_facts,
    has_alpha,
    is_decoded,
    oriented,
    peak_bytes,
    smaller,
)
from airflow_provider_raybatch.pipeline.read.image_sources import (  # noqa: F401 - re-exported
    BAD_VALUE_KIND,
    DEFAULT_SOURCES,
    FETCH_KIND,
    MISSING_KIND,
    NOT_ALLOWED_KIND,
    TOO_LARGE_KIND,
    ImageError,
    ImageSources,
    read_source,
)
from airflow_provider_raybatch.pipeline.read.image_sources import briefly as _describe
from airflow_provider_raybatch.pipeline.read.image_sources import decode_data_url as _decode_data_url
from airflow_provider_raybatch.pipeline.read.image_sources import reason as _reason
from airflow_provider_raybatch.pipeline.read.image_sources import shorten as _short
from airflow_provider_raybatch.pipeline.read.jpeg_layout import jpeg_layout_problem
from airflow_provider_raybatch.pipeline.read.png_layout import png_layout_problem
from airflow_provider_raybatch.pipeline.read.tiff_layout import tiff_layout_problem
from airflow_provider_raybatch.pipeline.read.webp_layout import webp_layout_problem
from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, JsonValue

if TYPE_CHECKING:
    from PIL.Image import Image

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: A side is under ``min_side``: nothing there for a caption to describe.
TOO_SMALL_KIND = "image too small"
#: Pillow cannot identify, verify or decode the bytes (corrupt, truncated, not an image).
BAD_IMAGE_KIND = "bad image"
#: Chat messages that are not messages, or a content part that is not a part (the kind prompts.py uses).
MESSAGES_KIND = "bad messages"

#: With no ``size`` or ``max_side``, images are shrunk to at most this many pixels: more detail than
#: the processors of common vision-language models keep, and a photo's JPEG stays a few MB per row.
DEFAULT_MAX_OUTPUT_PIXELS = 4 * 1024 * 1024
#: An image whose encoding for the engine is over this fails its row (``image too large``).
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
#: What :func:`split_image_parts` accepts, and so what no option may let a content part exceed.
PART_MAX_BYTES = 64 * 1024 * 1024
PART_MAX_PIXELS = 64 * 1024 * 1024
#: Image parts one row's messages may hold: each is a fetch and megabytes in the row.
DEFAULT_MAX_IMAGES = 16
#: What one row's images may encode to for the engine, all together: two images at
#: ``DEFAULT_MAX_OUTPUT_BYTES``, or sixteen photos of 2 MB. Without it, sixteen parts naming one
#: 12.6 MB PNG made a 256 MiB prompt, held twice over while it became the row's JSON.
DEFAULT_MAX_ROW_OUTPUT_BYTES = 2 * DEFAULT_MAX_OUTPUT_BYTES
#: What decoding one image may hold at once, every copy counted (the decoder's buffers, the pixels as
#: Pillow stores them, the EXIF rotation's copy, the composite over white, the RGB conversion and the
#: resize's passes): a row costs the worker a bounded amount however few bytes its file has.
DEFAULT_MAX_DECODE_BYTES = 192 * 1024 * 1024

_DATA_URL_PREFIX = "data:"
_ENCODE_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
_ENCODE_FORMATS = ("auto", *_ENCODE_MIME)
#: Formats Pillow may decode: the common ones, so that no rarely used decoder sees untrusted bytes.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")


@dataclass(frozen=True)
class ImageOptions:
    """How images are read, checked, resized and encoded; built once per job, checked when built.

    :param size: resize every image to exactly (width, height); None keeps the size. A fixed size
        gives every image the same vision-token count. At most ``PART_MAX_PIXELS`` pixels.
    :param max_side: shrink (never enlarge) so that the longer side is at most this many pixels,
        keeping the aspect ratio. Exclusive with ``size``.
    :param min_side: refuse an image whose shorter side is under this (default 8 pixels).
    :param max_pixels: refuse an image of more pixels than this, before decoding it (default 64 Mi,
        below Pillow's own decompression-bomb threshold of ~89 M).
    :param max_bytes: refuse an encoded image of more bytes than this (default 32 MiB).
    :param max_decode_bytes: refuse an image whose decoding would hold more memory than this at once,
        counted from its header before a pixel is decoded (default ``DEFAULT_MAX_DECODE_BYTES``,
        192 MiB). A JPEG larger than its output is decoded at 1/2, 1/4 or 1/8 scale, and another image
        shrunk before it is rotated and converted, where that keeps it within the bound.
    :param timeout_seconds: deadline for reading one URL, the whole fetch (default 20 s).
    :param encode_format: how images are encoded for the engine: ``"auto"`` (default: a JPEG stays a
        JPEG, anything else becomes PNG, or JPEG where the PNG is over ``max_output_bytes``),
        ``"PNG"`` (lossless) or ``"JPEG"`` (smallest).
    :param jpeg_quality: JPEG quality, 1 to 100 (default 95).
    :param max_output_pixels: with neither ``size`` nor ``max_side``, shrink (never enlarge) to at
        most this many pixels, keeping the aspect ratio (default ``DEFAULT_MAX_OUTPUT_PIXELS``, 4 Mi).
    :param max_output_bytes: refuse an image whose encoding for the engine is over this (default
        ``DEFAULT_MAX_OUTPUT_BYTES``, 16 MiB; at most ``PART_MAX_BYTES``).
    :param max_row_output_bytes: refuse a row whose images' encodings for the engine add up to more
        than this, checked after each image so that no more is read (default
        ``DEFAULT_MAX_ROW_OUTPUT_BYTES``, 32 MiB; at least ``max_output_bytes``).
    :param sources: where paths and URLs may be read from (:class:`.image_sources.ImageSources`);
        default: public http(s) addresses, and local paths or s3:// objects under ``relative_to``.
    """

    size: tuple[int, int] | None = None
    max_side: int | None = None
    min_side: int = 8
    max_pixels: int = 64 * 1024 * 1024
    max_bytes: int = 32 * 1024 * 1024
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
    timeout_seconds: float = 20.0
    encode_format: str = "auto"
    jpeg_quality: int = 95
    max_output_pixels: int = DEFAULT_MAX_OUTPUT_PIXELS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_row_output_bytes: int = DEFAULT_MAX_ROW_OUTPUT_BYTES
    sources: ImageSources = DEFAULT_SOURCES

    def __post_init__(self) -> None:
        # TypeError, not ValueError: a bad option is the job's mistake, not a row's.
        if self.size is not None and self.max_side is not None:
            raise TypeError(f"size={self.size!r} and max_side={self.max_side!r}: pass one of them, not both.")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise TypeError(f"size={self.size!r} is invalid: pass (width, height), both >= 1.")
        if self.size is not None and self.size[0] * self.size[1] > PART_MAX_PIXELS:
            raise TypeError(f"size={self.size!r} is invalid: at most {PART_MAX_PIXELS} pixels.")
        for name in (
            "max_side",
            "min_side",
            "max_pixels",
            "max_bytes",
            "max_decode_bytes",
            "max_output_pixels",
            "max_output_bytes",
            "max_row_output_bytes",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TypeError(f"{name}={value!r} is invalid: it must be >= 1.")
        for name, limit in (("max_output_pixels", PART_MAX_PIXELS), ("max_output_bytes", PART_MAX_BYTES)):
            if getattr(self, name) > limit:
                raise TypeError(f"{name}={getattr(self, name)!r} is invalid: at most {limit}.")
        if self.max_row_output_bytes < self.max_output_bytes:
            raise TypeError(
                f"max_row_output_bytes={self.max_row_output_bytes!r} is invalid: a row must hold one image, "
                f"so at least max_output_bytes={self.max_output_bytes!r}."
            )
        if self.timeout_seconds <= 0:
            raise TypeError(f"timeout_seconds={self.timeout_seconds!r} is invalid: it must be > 0.")
        if self.encode_format not in _ENCODE_FORMATS:
            raise TypeError(
                f"encode_format={self.encode_format!r} is invalid: use one of {list(_ENCODE_FORMATS)}."
            )
        if not 1 <= self.jpeg_quality <= 100:
            raise TypeError(f"jpeg_quality={self.jpeg_quality!r} is invalid: use 1 to 100.")


DEFAULT_OPTIONS = ImageOptions()


def options_for(spec: BatchInferenceSpec) -> ImageOptions:
    """A job's image options: its image_size / image_max_side and where its images may come from."""
    return _options(
        spec.image_size,
        spec.image_max_side,
        spec.input_uri,
        tuple(spec.image_allowed_hosts),
        spec.image_allowed_local_path,
        tuple(spec.image_allowed_s3_prefixes),
    )


@functools.cache
def _options(
    size: tuple[int, int] | None,
    max_side: int | None,
    input_uri: str,
    allowed_hosts: tuple[str, ...],
    allowed_local_path: str | None,
    allowed_s3_prefixes: tuple[str, ...],
) -> ImageOptions:
    """One ImageOptions per job and process (built per row, it would parse the allow-lists per row)."""
    sources = ImageSources(input_uri, allowed_hosts, allowed_local_path, allowed_s3_prefixes)
    return ImageOptions(size=size, max_side=max_side, sources=sources)


def _located(err: ValueError, where: str) -> ValueError:
    """``err``'s reason with the place of the image in the messages after its kind."""
    kind, _, detail = str(err).partition(": ")
    return _reason(kind, f"{where}: {detail}")


def _is_pil_image(value: CellValue) -> bool:
    module = sys.modules.get("PIL.Image")  # not imported yet: the value cannot be a PIL image
    return module is not None and isinstance(value, module.Image)


# -- reading the encoded bytes -------------------------------------------------------------------


def read_image_bytes(
    value: CellValue, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> bytes:
    """The encoded bytes of a row's image value; raises ValueError with the row's reason.

    :param relative_to: folder (local or URI) that relative paths are resolved against: the folder of
        the row's input file. Local images are read under it (or the whole input folder, with
        ``options.sources.input_uri``), and s3:// images under it when it is on S3. None: relative paths
        start from the working directory, and only ``options.sources``' own folders are allowed.
    """
    if value is None:
        raise _reason(MISSING_KIND, "the image value is None")
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if len(data) > options.max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{len(data)} bytes, over max_bytes={options.max_bytes}")
        return data
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return read_source(value, options.max_bytes, options.timeout_seconds, options.sources, relative_to)
    if isinstance(value, dict):
        return _read_struct(value, options, relative_to)
    raise _reason(BAD_VALUE_KIND, f"cannot read an image from a {type(value).__name__}: {_describe(value)}")


def _read_struct(value: dict[CellValue, CellValue], options: ImageOptions, relative_to: str | None) -> bytes:
    if "bytes" not in value and "path" not in value:
        raise _reason(
            BAD_VALUE_KIND,
            f"an image dict needs 'bytes' or 'path', got keys {_describe(sorted(map(str, value)))}",
        )
    data = value.get("bytes")
    if isinstance(data, str) and data.startswith(_DATA_URL_PREFIX):
        return _decode_data_url(data, options.max_bytes)
    if data is not None and not isinstance(data, bytes | bytearray | memoryview):
        raise _reason(BAD_VALUE_KIND, f"the image dict's 'bytes' holds a {type(data).__name__}, not bytes")
    if data is not None:
        return read_image_bytes(data, options)
    if value.get("path"):
        return read_image_bytes(str(value["path"]), options, relative_to)
    raise _reason(MISSING_KIND, "the image dict has neither bytes nor a path")


# -- checking, converting, resizing --------------------------------------------------------------


def decode_image(data: bytes, options: ImageOptions = DEFAULT_OPTIONS) -> Image:
    """Check encoded bytes with Pillow and return the decoded RGB image; raises ValueError."""
    return _decode(data, options, resize=False)[0]


def _decode(data: bytes, options: ImageOptions, *, resize: bool) -> tuple[Image, str | None]:
    """The decoded RGB image (at the size asked, with ``resize``) and the format it was stored in."""
    if not data:
        raise _reason(BAD_IMAGE_KIND, "empty bytes")
    # Before Pillow holds a TIFF's every strip as an object, libjpeg folds in a JPEG's every scan,
    # Pillow handles a PNG's every chunk or a GIF's every block before its first image, libwebp
    # keeps a WebP's every chunk, or Pillow steps through a run-length BMP's every instruction in
    # Python: each walk reads only lengths, markers and instructions.
    problem = (
        tiff_layout_problem(data)
        or jpeg_layout_problem(data)
        or png_layout_problem(data)
        or gif_layout_problem(data)
        or webp_layout_problem(data)
        or bmp_layout_problem(data)
    )
    if problem:
        raise _reason(BAD_IMAGE_KIND, problem)
    with _pillow_errors(), _open(data) as probe:  # reads the header only
        size, source_format = probe.size, probe.format
    _check_dimensions(size, options)  # before decoding a single pixel: bombs stop here
    with _pillow_errors():
        with _open(data) as probe:
            probe.verify()  # structure and checksums, without decoding the pixels
        image = _open(data)  # verify() leaves an image unusable: reopen
    return _converted(image, options, resize=resize, pinned=False), source_format


def _from_pil(image: Image, options: ImageOptions) -> tuple[Image, str | None]:
    """A PIL image a preprocess made, held to the same checks as decoded bytes, at the size asked."""
    source_format = image.format
    with _pillow_errors():
        size = image.size
    _check_dimensions(size, options)
    return _converted(image, options, resize=True, pinned=True), source_format


def _open(data: bytes) -> Image:
    from PIL import Image as PILImage

    return PILImage.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)


@contextmanager
def _pillow_errors() -> Iterator[None]:
    """Pillow's exceptions -> our reasons: any decoder failure is this row's problem, not the job's."""
    from PIL import Image as PILImage

    try:
        yield
    except ImageError:
        raise
    except PILImage.DecompressionBombError as err:
        raise _reason(TOO_LARGE_KIND, str(err)) from err
    except PILImage.UnidentifiedImageError as err:
        raise _reason(
            BAD_IMAGE_KIND, f"cannot identify image file (accepted: {', '.join(ACCEPTED_FORMATS)})"
        ) from err
    except Exception as err:  # noqa: BLE001 - OSError, SyntaxError, struct.error, ... from the decoders
        raise _reason(BAD_IMAGE_KIND, f"{type(err).__name__}: {_short(str(err))}") from err


def _check_dimensions(size: tuple[int, int], options: ImageOptions) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise _reason(BAD_IMAGE_KIND, f"zero-size image ({width}x{height})")
    if width * height > options.max_pixels:
        raise _reason(TOO_LARGE_KIND, f"{width}x{height} pixels, over max_pixels={options.max_pixels}")
    if min(width, height) < options.min_side:
        raise _reason(TOO_SMALL_KIND, f"{width}x{height} pixels, a side under min_side={options.min_side}")


def _to_rgb(image: Image) -> Image:
    from PIL import Image as PILImage

    if image.mode == "RGB":
        return image
    if has_alpha(image):
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        composite = PILImage.alpha_composite(PILImage.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        del rgba  # the conversion needs only the composite: one full-size copy fewer held
        return composite.convert("RGB")
    return image.convert("RGB")


def _target_size(size: tuple[int, int], options: ImageOptions) -> tuple[int, int]:
    """The size ``options`` ask of an image of ``size``: fixed, or shrunk to max_side or max_output_pixels."""
    width, height = size
    if options.size is not None:
        return (options.size[0], options.size[1])
    if options.max_side is not None:
        if max(size) <= options.max_side:
            return size
        scale = options.max_side / max(size)
        return (max(1, round(width * scale)), max(1, round(height * scale)))
    if width * height <= options.max_output_pixels:
        return size
    scale = math.sqrt(options.max_output_pixels / (width * height))
    target = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
    while target[0] * target[1] > options.max_output_pixels:  # a rounding error's pixel or two
        target = (target[0] - (target[0] >= target[1]), target[1] - (target[1] > target[0]))
    return target


def resize_image(image: Image, options: ImageOptions = DEFAULT_OPTIONS) -> Image:
    """Resize to ``options.size``, or shrink to ``options.max_side``, or else to ``max_output_pixels``."""
    return _resized(image, _target_size(image.size, options))


def _resized(image: Image, size: tuple[int, int]) -> Image:
    from PIL import Image as PILImage

    if size == image.size:
        return image
    return image.resize(size, PILImage.Resampling.BICUBIC)


def _load(value: CellValue, options: ImageOptions, relative_to: str | None) -> tuple[Image, str | None]:
    if _is_pil_image(value):
        return _from_pil(value, options)
    return _decode(read_image_bytes(value, options, relative_to), options, resize=True)


def load_image(
    value: CellValue, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> Image:
    """A row's image value (or a PIL image) -> a checked, RGB, resized PIL image; raises ValueError."""
    return _load(value, options, relative_to)[0]


# -- decoding within max_decode_bytes (what each order holds: :mod:`.image_decode_memory`) ------


def _order(facts: DecodeFacts, target: tuple[int, int], options: ImageOptions) -> bool | None:
    """False: the usual order fits max_decode_bytes; True: only shrinking first does; None: neither."""
    if peak_bytes(facts, target, shrink_first=False) <= options.max_decode_bytes:
        return False
    smaller = target[0] * target[1] < facts.size[0] * facts.size[1]
    if smaller and peak_bytes(facts, target, shrink_first=True) <= options.max_decode_bytes:
        return True
    return None


def _target(
    size: tuple[int, int], orientation: int | None, options: ImageOptions, resize: bool
) -> tuple[int, int]:
    """The upright output size: what ``options`` ask, or the upright size itself without ``resize``."""
    upright = oriented(size, orientation)
    return _target_size(upright, options) if resize else upright


def _too_large(facts: DecodeFacts, target: tuple[int, int], options: ImageOptions) -> ImageError:
    width, height = facts.size
    peak = min(peak_bytes(facts, target, shrink_first) for shrink_first in (False, True))
    fits = facts
    while fits.size != (1, 1) and _order(fits, smaller(target, fits.size), options) is None:
        fits = replace(fits, size=smaller(fits.size, (fits.size[0] * 31 // 32, fits.size[1] * 31 // 32)))
    return _reason(
        TOO_LARGE_KIND,
        f"{width}x{height} {facts.mode} pixels need about {peak >> 20} MiB to decode, over "
        f"max_decode_bytes={options.max_decode_bytes >> 20} MiB; shrink it to at most about "
        f"{fits.size[0]}x{fits.size[1]}",
    )


def _converted(image: Image, options: ImageOptions, *, resize: bool, pinned: bool) -> Image:
    """``image`` (opened, decoded or not) decoded, upright, RGB and, with ``resize``, at the size asked.

    Raises ``image too large`` before decoding where no order of the steps fits ``max_decode_bytes``.
    """
    with _pillow_errors():
        _check_exif(image)
        facts = decode_facts(image, pinned)  # parses the EXIF for the orientation
        target = _target(image.size, facts.orientation, options, resize)
        shrink_first = _order(facts, target, options)
        if shrink_first is None and _drafted(image, facts, target):
            # The decoder's coefficients stay as counted: a progressive JPEG holds them at full size.
            shrink_first = _order(replace(facts, size=image.size), target, options)
        if shrink_first is None:
            raise _too_large(facts, target, options)
        image.load()  # decodes the pixels: truncated data fails here
        _check_exif(image)
        # Decoded, the image tells its mode and orientation for sure (a PNG's eXIf after its pixels).
        facts = replace(decode_facts(image, pinned), decoder_bytes=0)
        target = _target(image.size, facts.orientation, options, resize)
        shrink_first = _order(facts, target, options)
        if shrink_first is None:
            raise _too_large(facts, target, options)
        return _steps(image, facts, target, shrink_first)


def _check_exif(image: Image) -> None:
    problem = exif_problem(image.info)
    if problem:
        raise _reason(BAD_IMAGE_KIND, problem)


def _drafted(image: Image, facts: DecodeFacts, target: tuple[int, int]) -> bool:
    """Have libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale, never under ``target``; False if it will not."""
    if image.format not in JPEG_FORMATS or is_decoded(image):
        return False
    stored_target = oriented(target, facts.orientation)
    if stored_target[0] >= image.size[0] or stored_target[1] >= image.size[1]:
        return False
    image.draft(None, stored_target)
    return image.size != facts.size


def _steps(image: Image, facts: DecodeFacts, target: tuple[int, int], shrink_first: bool) -> Image:
    from PIL import ImageOps

    rotated = facts.orientation in ROTATED
    # Each step rebinds ``image``, so that a copy is freed as soon as the next one is made.
    if shrink_first:
        if image.mode not in RESIZABLE:  # P and 1 would be resized with NEAREST
            image = image.convert("RGBA" if facts.alpha else "RGB")
        image = _resized(image, oriented(target, facts.orientation))
        if rotated:
            ImageOps.exif_transpose(image, in_place=True)  # the shrunk image is ours to change
        return _to_rgb(image)
    if rotated and facts.pinned:
        image = ImageOps.exif_transpose(image)  # a preprocess's image is not ours to change
    elif rotated:
        ImageOps.exif_transpose(image, in_place=True)  # phone photos carry their rotation in EXIF
    image = _to_rgb(image)
    return _resized(image, target)


def describe_image_value(value: CellValue) -> JsonValue:
    """A short stand-in for a row's image value, to show in error rows instead of megabytes of bytes.

    Bytes and data URLs become ``"<N bytes>"``; a PIL image ``"<WxH MODE image>"``; paths and URLs stay
    (truncated), as they say where the image is; an image struct keeps its shape with its parts described.
    """
    return _described_value(value, depth=0)


def _described_value(value: CellValue, depth: int) -> JsonValue:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    if _is_pil_image(value):
        return f"<{value.width}x{value.height} {value.mode} image>"
    if isinstance(value, dict) and depth < 4:
        return {str(key): _described_value(item, depth + 1) for key, item in value.items()}
    if isinstance(value, str):
        if value.startswith(_DATA_URL_PREFIX):
            return _described_data_url(value)
        return _short(value)
    return _describe(value)


def _data_url_bytes(url: str) -> int:
    """The size of what a base64 data URL's payload decodes to, without decoding it."""
    payload = url.partition(",")[2]
    return len(payload) * 3 // 4 - len(payload) + len(payload.rstrip("="))


def _described_data_url(url: str) -> str:
    header = url.partition(",")[0]
    size = _data_url_bytes(url)
    mime = _short(header.removeprefix(_DATA_URL_PREFIX).split(";", 1)[0], 60)
    # application/octet-stream: bytes the pipeline itself carried as a data URL (pipeline/read/records.py)
    if mime in ("", "application/octet-stream"):
        return f"<{size} bytes>"
    return f"<{mime} data URL, {size} bytes>"


# -- what the engine takes -----------------------------------------------------------------------


def _encoded(image: Image, image_format: str, options: ImageOptions) -> bytes:
    buffer = io.BytesIO()
    with _pillow_errors():
        if image_format == "JPEG":
            image.save(buffer, format="JPEG", quality=options.jpeg_quality)
        else:
            image.save(buffer, format="PNG")
    return buffer.getvalue()


def _encode_for_engine(image: Image, options: ImageOptions, source_format: str | None) -> tuple[str, bytes]:
    """(format, bytes) of the image for the engine, within max_output_bytes; raises ValueError."""
    width, height = image.size
    if width * height > PART_MAX_PIXELS:
        raise _reason(TOO_LARGE_KIND, f"{width}x{height} pixels, over {PART_MAX_PIXELS} for the engine")
    image_format = options.encode_format
    if image_format == "auto":
        image_format = "JPEG" if source_format == "JPEG" else "PNG"
    data = _encoded(image, image_format, options)
    if len(data) > options.max_output_bytes and options.encode_format == "auto" and image_format == "PNG":
        image_format, data = "JPEG", _encoded(image, "JPEG", options)  # a photo that came as a PNG
    if len(data) > options.max_output_bytes:
        raise _reason(
            TOO_LARGE_KIND,
            f"{width}x{height} pixels encode to {len(data)} bytes as {image_format}, over "
            f"max_output_bytes={options.max_output_bytes}; shrink it (image_max_side or image_size)",
        )
    return image_format, data


def image_data_url(
    image: Image, options: ImageOptions = DEFAULT_OPTIONS, source_format: str | None = None
) -> str:
    """The image (as RGB) encoded as a ``data:image/...;base64,`` URL of at most ``max_output_bytes``.

    :param source_format: the format the image was read from (default: ``image.format``); with
        ``encode_format="auto"`` a JPEG stays a JPEG.
    """
    with _pillow_errors():
        rgb = _to_rgb(image)
    image_format, data = _encode_for_engine(rgb, options, source_format or image.format)
    return f"data:{_ENCODE_MIME[image_format]};base64,{base64.b64encode(data).decode('ascii')}"


def image_content_part(
    image: Image, options: ImageOptions = DEFAULT_OPTIONS, source_format: str | None = None
) -> JsonObject:
    """The OpenAI-style content part vLLM's chat parser and ray.data.llm take for one image.

    Raises ValueError (``image too large``) rather than return a part :func:`split_image_parts` refuses.
    """
    return {"type": "image_url", "image_url": {"url": image_data_url(image, options, source_format)}}


def content_part_for(
    value: CellValue, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> dict[str, JsonValue]:
    """:func:`load_image` then :func:`image_content_part`: a row's image value -> its content part.

    Everything that can fail for a row's image fails here, where the row is prepared, as a ValueError
    with the reason; the part it returns is one :func:`split_image_parts` always decodes.
    """
    image, source_format = _load(value, options, relative_to)
    return image_content_part(image, options, source_format)


#: How split_image_parts decodes the parts: any size this module may have produced.
_PART_OPTIONS = ImageOptions(min_side=1, max_pixels=PART_MAX_PIXELS, max_bytes=PART_MAX_BYTES)


def split_image_parts(
    messages: list[JsonObject],
) -> tuple[list[JsonObject], list[Image]]:
    """Messages with data-URL image parts -> (messages with ``{"type": "image"}`` parts, the images).

    This is the shape a model's chat template and ``multi_modal_data={"image": images}`` expect when
    the prompt is rendered without vLLM's chat parser (the HF chat templates of vision-language
    models render ``{"type": "image"}`` as their image placeholder). Only data URLs made by
    :func:`image_content_part` are decoded here; any other image part, and messages that are not
    messages, raise ValueError with a reason (never another type: this runs outside a row's handler).
    """
    if not isinstance(messages, list):
        raise _reason(
            MESSAGES_KIND, f"messages must be a list of chat messages, got a {type(messages).__name__}"
        )
    images: list[Image] = []
    rendered: list[JsonObject] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _reason(MESSAGES_KIND, f"message {index} is a {type(message).__name__}, not an object")
        content = message.get("content")
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = [
            _split_part(f"message {index} part {number}", part, images) for number, part in enumerate(content)
        ]
        rendered.append({**message, "content": parts})
    return rendered, images


def _split_part(where: str, part: CellValue, images: list[Image]) -> CellValue:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image":  # a placeholder here would have no image: the counts would disagree
        raise _reason(
            BAD_VALUE_KIND, f"{where}: an image part that was not prepared (normalize_message_images)"
        )
    if kind != "image_url":
        return part
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url.startswith(_DATA_URL_PREFIX):
        raise _reason(BAD_VALUE_KIND, f"{where}: image part is not a data URL: {_describe(url)}")
    try:
        images.append(decode_image(_decode_data_url(url, PART_MAX_BYTES), _PART_OPTIONS))
    except ValueError as err:
        raise _located(err, where) from err
    return {"type": "image"}


# -- images inside chat messages -----------------------------------------------------------------

_TEXT = object()  # what _image_value returns for a text part


def normalize_message_images(
    messages: CellValue,
    options: ImageOptions = DEFAULT_OPTIONS,
    relative_to: str | None = None,
    *,
    max_images: int = DEFAULT_MAX_IMAGES,
) -> list[dict[str, JsonValue]]:
    """A copy of chat messages with every image part replaced by its canonical content part.

    A preprocess written for Ray Data LLM returns images as ``{"type": "image", "image": <PIL image,
    bytes, a data: URL, a path, an http(s)://, s3:// or file:// URL>}`` or OpenAI's ``{"type":
    "image_url", "image_url": {"url": ...}}`` (or ``"image_url": "<url>"``). Each is read, checked and
    encoded as :func:`content_part_for` does for ``image_column``, so that the messages are JSON and
    :func:`split_image_parts` decodes them for the engine. Text parts and text contents pass unchanged.
    An image the row names again (another path to the same file, the same bytes) is decoded once: the
    per-image bounds then bound the row by its distinct images, not by ``max_images`` times the worst.

    :param relative_to: folder that relative paths are resolved against (the input file's).
    :param max_images: image parts allowed in one row's messages; more fail the row before any is read.
    :raises ValueError: ``bad messages: message 0 part 1: ...`` for what is not a message or a part;
        an image's own reason with its place, e.g. ``bad image: message 0 part 1: ...``;
        ``image too large: message 0 part 3: ...`` once the row's images encode to more than
        ``options.max_row_output_bytes`` together.
    """
    _check_messages(messages, max_images)  # before any image is read: a bad part fails fast
    made = _RowOutput(options.max_row_output_bytes)
    return [
        _normalized_message(index, message, options, relative_to, made)
        for index, message in enumerate(messages)
    ]


@dataclass
class _RowOutput:
    """What a row's images have encoded to so far, against ``max_row_output_bytes``, and the part each
    distinct image made: an image named again in the row (by another path to the same file, or the same
    bytes) is decoded once, so a row costs at most what its distinct images cost."""

    limit: int
    total: int = 0
    parts: dict[tuple[str, bytes | int], JsonObject] = field(default_factory=dict)

    def part_for(self, value: CellValue, options: ImageOptions, relative_to: str | None) -> JsonObject:
        """The content part of the image ``value`` names, made the first time the row names that image."""
        if _is_pil_image(value):  # a preprocess's image: the same object is the same image
            key: tuple[str, bytes | int] = ("object", id(value))
            if key not in self.parts:
                self.parts[key] = content_part_for(value, options, relative_to)
        else:
            data = read_image_bytes(value, options, relative_to)
            key = ("bytes", hashlib.blake2b(data, digest_size=16).digest())
            if key not in self.parts:
                image, source_format = _decode(data, options, resize=True)
                self.parts[key] = image_content_part(image, options, source_format)
        made = self.parts[key]
        return {**made, "image_url": dict(made["image_url"])}  # each part its own, as the messages' are

    def add(self, where: str, part: JsonObject) -> None:
        """Count an image part just made; refuse the row before the next image is read."""
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else None
        self.total += _data_url_bytes(url) if isinstance(url, str) else 0
        if self.total > self.limit:
            raise _reason(
                TOO_LARGE_KIND,
                f"{where}: the row's images encode to {self.total} bytes for the engine so far, over "
                f"max_row_output_bytes={self.limit}; use fewer or smaller images (image_max_side)",
            )


def _check_messages(messages: CellValue, max_images: int) -> None:
    """Raise ``bad messages`` for the first part that is not a part, or for one image too many."""
    if not isinstance(messages, list):
        raise _reason(
            MESSAGES_KIND, f"messages must be a list of chat messages, got a {type(messages).__name__}"
        )
    count = 0
    for index, message in enumerate(messages):
        for where, part in _content_parts(index, message):
            count += _image_value(where, part) is not _TEXT
            if count > max_images:
                raise _reason(MESSAGES_KIND, f"{where}: more than max_images={max_images} images")


def _content_parts(index: int, message: JsonValue) -> list[tuple[str, JsonValue]]:
    """(place, part) of a message's content parts; none for a text content or none at all."""
    if not isinstance(message, dict):
        raise _reason(MESSAGES_KIND, f"message {index} is a {type(message).__name__}, not an object")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return []
    if not isinstance(content, list):
        raise _reason(
            MESSAGES_KIND,
            f"message {index}: content must be text or a list of parts, got a {type(content).__name__}",
        )
    return [(f"message {index} part {number}", part) for number, part in enumerate(content)]


def _image_value(where: str, part: JsonValue) -> CellValue:
    """The image a part carries, ``_TEXT`` for a text part; raises ``bad messages`` for anything else."""
    if not isinstance(part, dict):
        raise _reason(MESSAGES_KIND, f"{where} is a {type(part).__name__}, not an object")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise _reason(MESSAGES_KIND, f"{where}: a text part needs 'text', a string")
        return _TEXT
    if kind == "image":
        if part.get("image") is None:
            raise _reason(
                MESSAGES_KIND, f"{where}: an image part needs 'image' (a PIL image, bytes, a path or URL)"
            )
        return part["image"]
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str):
            raise _reason(MESSAGES_KIND, f"{where}: an image_url part needs 'image_url': {{'url': <a URL>}}")
        return url
    raise _reason(
        MESSAGES_KIND, f"{where}: unknown part type {_describe(kind)} (accepted: text, image, image_url)"
    )


def _normalized_message(
    index: int, message: JsonObject, options: ImageOptions, relative_to: str | None, made: _RowOutput
) -> JsonObject:
    parts = _content_parts(index, message)
    if not parts:
        return dict(message)
    content = [_normalized_part(where, part, options, relative_to, made) for where, part in parts]
    return {**message, "content": content}


def _normalized_part(
    where: str, part: JsonObject, options: ImageOptions, relative_to: str | None, made: _RowOutput
) -> JsonObject:
    value = _image_value(where, part)
    if value is _TEXT:
        return dict(part)
    try:
        normalized = made.part_for(value, options, relative_to)
    except ValueError as err:
        raise _located(err, where) from err
    made.add(where, normalized)
    return normalized


def describe_message_images(messages: CellValue) -> JsonValue:
    """A copy of chat messages with each image replaced by a short description (:func:`describe_image_value`).

    For error rows and outputs, which must never carry image bytes. Takes anything (it runs on rows
    whose messages were malformed too): bytes and PIL images anywhere are described; text is kept.
    """
    if not isinstance(messages, list):
        return _scrubbed(messages, depth=0)
    return [_described_message(message) for message in messages]


def _described_message(message: CellValue) -> JsonValue:
    if not isinstance(message, dict):
        return _scrubbed(message, depth=1)
    described = {str(key): _scrubbed(value, depth=1) for key, value in message.items() if key != "content"}
    content = message.get("content")
    if isinstance(content, list):
        described["content"] = [_described_part(part) for part in content]
    elif "content" in message:
        described["content"] = _scrubbed(content, depth=1)
    return described


def _described_part(part: CellValue) -> JsonValue:
    if not isinstance(part, dict):
        return _scrubbed(part, depth=2)
    kind = part.get("type")
    described = {str(key): _scrubbed(value, depth=2) for key, value in part.items()}
    if kind == "image" and "image" in part:
        described["image"] = describe_image_value(part["image"])
    elif kind == "image_url" and isinstance(part.get("image_url"), dict):
        described["image_url"] = {
            str(key): describe_image_value(value) if key == "url" else _scrubbed(value, depth=3)
            for key, value in part["image_url"].items()
        }
    elif kind == "image_url" and "image_url" in part:
        described["image_url"] = describe_image_value(part["image_url"])
    return described


def _scrubbed(value: CellValue, depth: int) -> JsonValue:
    """``value`` with bytes and PIL images described, as JSON; text and numbers as they are."""
    if isinstance(value, bytes | bytearray | memoryview) or _is_pil_image(value):
        return describe_image_value(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if depth > 8:  # deeper than any message: shown, not walked
        return _describe(value)
    if isinstance(value, dict):
        return {str(key): _scrubbed(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_scrubbed(item, depth + 1) for item in value]
    return _describe(value)
