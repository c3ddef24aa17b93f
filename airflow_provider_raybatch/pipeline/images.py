"""Turn one row's image value into a validated image for a vision-language model, or say why not.

A row's image may be a Hugging Face image struct (``{"bytes": b"...", "path": ...}`` as image
datasets store it in Parquet), raw bytes, a ``data:image/...;base64,`` URL, a local path, a
``file://`` / ``s3://`` URI (read through pyarrow's filesystems, as :mod:`.storage` does) or an
``http(s)://`` URL (fetched with a deadline and a size cap). :func:`load_image` reads it, checks it
with Pillow (identify, verify, decode, size limits), applies the EXIF orientation, converts it to
RGB (transparent pixels over white) and optionally resizes it to bound the vision-token budget.

A bad value raises ``ValueError`` whose text is the row's error reason, ``"<kind>: <detail>"`` with
one of the ``*_KIND`` constants, the convention :mod:`.prompts` uses (``run.py`` turns it into an
error row).

What the engine gets: :func:`image_content_part` returns an OpenAI-style content part
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``. A data URL, not a PIL
image or bytes, because the pipeline carries each row's messages as JSON text through Ray Data;
vLLM's chat parser (which ``ray.data.llm``'s prepare-multimodal stage calls) decodes data URLs itself,
with no network and no ``allowed_local_media_path``, and has no content part for raw bytes.
:func:`split_image_parts` turns such messages into the placeholder messages plus decoded images
that ``vllm.LLM.generate`` / ray.data.llm's engine stage take as ``multi_modal_data``, for when the
prepare-multimodal stage cannot be used.

Pillow is imported lazily: the module imports on a machine without it (the Airflow side).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

#: The value is None or empty, or names a file that does not exist.
MISSING_KIND = "missing image"
#: The value is not something an image can be read from (wrong type or shape, unsupported scheme).
BAD_VALUE_KIND = "bad image value"
#: Reading the file, object or URL failed (HTTP error, timeout, permission, network).
FETCH_KIND = "image fetch failed"
#: The bytes are over ``max_bytes`` or the pixels over ``max_pixels`` (decompression bombs).
TOO_LARGE_KIND = "image too large"
#: A side is under ``min_side``: nothing there for a caption to describe.
TOO_SMALL_KIND = "image too small"
#: Pillow cannot identify, verify or decode the bytes (corrupt, truncated, not an image).
BAD_IMAGE_KIND = "bad image"

_DATA_URL_PREFIX = "data:"
_HTTP_SCHEMES = ("http://", "https://")
_CHUNK_BYTES = 1 << 16
_ENCODE_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
#: Formats Pillow may decode: the common ones, so that no rarely used decoder sees untrusted bytes.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")


@dataclass(frozen=True)
class ImageOptions:
    """How images are read, checked and resized; built once per job, checked when built.

    :param size: resize every image to exactly (width, height); None keeps the size. A fixed size
        gives every image the same vision-token count.
    :param max_side: shrink (never enlarge) so that the longer side is at most this many pixels,
        keeping the aspect ratio. Exclusive with ``size``.
    :param min_side: refuse an image whose shorter side is under this (default 8 pixels).
    :param max_pixels: refuse an image of more pixels than this, before decoding it (default 64 Mi,
        below Pillow's own decompression-bomb threshold of ~89 M).
    :param max_bytes: refuse an encoded image of more bytes than this (default 32 MiB).
    :param timeout_seconds: deadline for reading one URL (default 20 s).
    :param encode_format: ``"PNG"`` (lossless, default) or ``"JPEG"`` (smaller rows) for data URLs.
    :param jpeg_quality: JPEG quality when ``encode_format="JPEG"`` (default 95).
    """

    size: tuple[int, int] | None = None
    max_side: int | None = None
    min_side: int = 8
    max_pixels: int = 64 * 1024 * 1024
    max_bytes: int = 32 * 1024 * 1024
    timeout_seconds: float = 20.0
    encode_format: str = "PNG"
    jpeg_quality: int = 95

    def __post_init__(self) -> None:
        # TypeError, not ValueError: a bad option is the job's mistake, not a row's.
        if self.size is not None and self.max_side is not None:
            raise TypeError(f"size={self.size!r} and max_side={self.max_side!r}: pass one of them, not both.")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise TypeError(f"size={self.size!r} is invalid: pass (width, height), both >= 1.")
        for name in ("max_side", "min_side", "max_pixels", "max_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TypeError(f"{name}={value!r} is invalid: it must be >= 1.")
        if self.timeout_seconds <= 0:
            raise TypeError(f"timeout_seconds={self.timeout_seconds!r} is invalid: it must be > 0.")
        if self.encode_format not in _ENCODE_MIME:
            raise TypeError(
                f"encode_format={self.encode_format!r} is invalid: use one of {sorted(_ENCODE_MIME)}."
            )


DEFAULT_OPTIONS = ImageOptions()
_ANY_SIZE = ImageOptions(min_side=1)  # for images this module encoded itself


def _reason(kind: str, detail: str) -> ValueError:
    return ValueError(f"{kind}: {detail}")


def _describe(value: Any) -> str:  # Any: whatever the row holds.
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


# -- reading the encoded bytes -------------------------------------------------------------------


def _read_capped(
    stream: Any, where: str, max_bytes: int, deadline: float | None = None
) -> bytes:  # Any: file-like.
    chunks, total = [], 0
    while chunk := stream.read(_CHUNK_BYTES):
        total += len(chunk)
        if total > max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{where} is over max_bytes={max_bytes}")
        if deadline is not None and time.monotonic() > deadline:
            raise _reason(FETCH_KIND, f"{where}: timed out while reading")
        chunks.append(chunk)
    return b"".join(chunks)


def _read_local(path: str, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as stream:
            return _read_capped(stream, path, max_bytes)
    except FileNotFoundError as err:
        raise _reason(MISSING_KIND, f"no such file: {path}") from err
    except IsADirectoryError as err:
        raise _reason(BAD_VALUE_KIND, f"{path} is a folder, not an image file") from err
    except OSError as err:
        raise _reason(FETCH_KIND, f"{path}: {err.strerror or err}") from err


def _read_uri(uri: str, max_bytes: int) -> bytes:
    from pyarrow import fs

    from airflow_provider_raybatch.pipeline import storage

    try:
        filesystem, path = storage.filesystem(uri)
    except (ValueError, OSError) as err:  # pyarrow.ArrowInvalid is a ValueError: unknown scheme
        raise _reason(BAD_VALUE_KIND, f"cannot read {uri}: {err}") from err
    try:
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.NotFound:
            raise _reason(MISSING_KIND, f"no such object: {uri}")
        if info.type != fs.FileType.File:
            raise _reason(BAD_VALUE_KIND, f"{uri} is a folder, not an image file")
        if info.size is not None and info.size > max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{uri} has {info.size} bytes, over max_bytes={max_bytes}")
        with filesystem.open_input_stream(path) as stream:
            return _read_capped(stream, uri, max_bytes)
    except OSError as err:  # access denied, network, throttling
        raise _reason(FETCH_KIND, f"{uri}: {err}") from err


def _read_http(url: str, max_bytes: int, timeout_seconds: float) -> bytes:
    deadline = time.monotonic() + timeout_seconds
    request = urllib.request.Request(url, headers={"User-Agent": "airflow-provider-raybatch"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise _reason(TOO_LARGE_KIND, f"{url} declares {declared} bytes, over max_bytes={max_bytes}")
            return _read_capped(response, url, max_bytes, deadline)
    except urllib.error.HTTPError as err:
        raise _reason(FETCH_KIND, f"{url}: HTTP {err.code} {err.reason}") from err
    except urllib.error.URLError as err:
        raise _reason(FETCH_KIND, f"{url}: {err.reason}") from err
    except (TimeoutError, OSError) as err:  # a read timeout after the headers arrived
        raise _reason(FETCH_KIND, f"{url}: {type(err).__name__}: {err}") from err


def _decode_data_url(url: str, max_bytes: int) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise _reason(BAD_VALUE_KIND, f"a data URL must be data:<mime>;base64,<data>, got {_describe(url)}")
    if len(payload) * 3 // 4 > max_bytes:
        raise _reason(
            TOO_LARGE_KIND, f"data URL of ~{len(payload) * 3 // 4} bytes, over max_bytes={max_bytes}"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as err:
        raise _reason(BAD_VALUE_KIND, f"data URL is not valid base64: {err}") from err


def _read_path(path: str, options: ImageOptions, relative_to: str | None) -> bytes:
    if not path.strip():
        raise _reason(MISSING_KIND, "the image path is empty")
    if path.startswith(_DATA_URL_PREFIX):
        return _decode_data_url(path, options.max_bytes)
    if path.startswith(_HTTP_SCHEMES):
        return _read_http(path, options.max_bytes, options.timeout_seconds)
    if "://" in path:
        return _read_uri(path, options.max_bytes)
    if relative_to is not None and not os.path.isabs(path):
        if "://" in relative_to:
            return _read_uri(f"{relative_to.rstrip('/')}/{path}", options.max_bytes)
        path = os.path.join(relative_to, path)
    return _read_local(path, options.max_bytes)


def read_image_bytes(
    value: Any, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> bytes:  # Any: a row's cell.
    """The encoded bytes of a row's image value; raises ValueError with the row's reason.

    :param relative_to: folder (local or URI) that relative paths are resolved against, e.g. the
        input folder; None resolves them against the working directory.
    """
    if value is None:
        raise _reason(MISSING_KIND, "the image value is None")
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if len(data) > options.max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{len(data)} bytes, over max_bytes={options.max_bytes}")
        return data
    if isinstance(value, os.PathLike):
        return _read_path(os.fspath(value), options, relative_to)
    if isinstance(value, str):
        return _read_path(value, options, relative_to)
    if isinstance(value, dict):
        if "bytes" not in value and "path" not in value:
            raise _reason(
                BAD_VALUE_KIND, f"an image dict needs 'bytes' or 'path', got keys {sorted(map(str, value))}"
            )
        data = value.get("bytes")
        if isinstance(data, str) and data.startswith(_DATA_URL_PREFIX):
            return _decode_data_url(data, options.max_bytes)
        if data is not None and not isinstance(data, bytes | bytearray | memoryview):
            raise _reason(
                BAD_VALUE_KIND, f"the image dict's 'bytes' holds a {type(data).__name__}, not bytes"
            )
        if data is not None:
            return read_image_bytes(data, options)
        if value.get("path"):
            return read_image_bytes(str(value["path"]), options, relative_to)
        raise _reason(MISSING_KIND, "the image dict has neither bytes nor a path")
    raise _reason(BAD_VALUE_KIND, f"cannot read an image from a {type(value).__name__}: {_describe(value)}")


# -- checking, converting, resizing --------------------------------------------------------------


def decode_image(data: bytes, options: ImageOptions = DEFAULT_OPTIONS) -> Image:
    """Check encoded bytes with Pillow and return the decoded RGB image; raises ValueError."""
    from PIL import ImageOps

    if not data:
        raise _reason(BAD_IMAGE_KIND, "empty bytes")
    with _pillow_errors(), _open(data) as probe:  # reads the header only
        size = probe.size
    _check_dimensions(size, options)  # before decoding a single pixel: bombs stop here
    with _pillow_errors():
        with _open(data) as probe:
            probe.verify()  # structure and checksums, without decoding the pixels
        image = _open(data)  # verify() leaves an image unusable: reopen
        image.load()  # decodes the pixels: truncated data fails here
        image = ImageOps.exif_transpose(image)  # phone photos carry their rotation in EXIF
        return _to_rgb(image)


def _open(data: bytes) -> Image:
    from PIL import Image as PILImage

    return PILImage.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)


@contextmanager
def _pillow_errors() -> Iterator[None]:
    """Pillow's exceptions -> our reasons: any decoder failure is this row's problem, not the job's."""
    from PIL import Image as PILImage

    try:
        yield
    except PILImage.DecompressionBombError as err:
        raise _reason(TOO_LARGE_KIND, str(err)) from err
    except PILImage.UnidentifiedImageError as err:
        raise _reason(
            BAD_IMAGE_KIND, f"cannot identify image file (accepted: {', '.join(ACCEPTED_FORMATS)})"
        ) from err
    except Exception as err:  # noqa: BLE001 - OSError, SyntaxError, struct.error, ... from the decoders
        raise _reason(BAD_IMAGE_KIND, f"{type(err).__name__}: {err}") from err


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
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PILImage.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def resize_image(image: Image, options: ImageOptions = DEFAULT_OPTIONS) -> Image:
    """Resize to ``options.size``, or shrink to ``options.max_side``; otherwise return it unchanged."""
    from PIL import Image as PILImage

    if options.size is not None:
        if image.size == tuple(options.size):
            return image
        return image.resize(tuple(options.size), PILImage.Resampling.BICUBIC)
    if options.max_side is not None and max(image.size) > options.max_side:
        scale = options.max_side / max(image.size)
        target = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        return image.resize(target, PILImage.Resampling.BICUBIC)
    return image


def load_image(
    value: Any, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> Image:  # Any: a cell.
    """A row's image value -> a checked, RGB, resized PIL image; raises ValueError with the reason."""
    return resize_image(decode_image(read_image_bytes(value, options, relative_to), options), options)


def describe_image_value(value: Any) -> Any:  # Any: a row's cell in, a JSON value out.
    """A short stand-in for a row's image value, to show in error rows instead of megabytes of bytes.

    Bytes and data URLs become ``"<N bytes>"``; paths and URLs stay (truncated), as they say where the
    image is; an image struct keeps its shape with its parts described.
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    if isinstance(value, dict):
        return {str(key): describe_image_value(item) for key, item in value.items()}
    if isinstance(value, str):
        if value.startswith(_DATA_URL_PREFIX):
            header, _, payload = value.partition(",")
            size = len(payload) * 3 // 4 - len(payload) + len(payload.rstrip("="))  # the decoded size
            mime = header.removeprefix(_DATA_URL_PREFIX).split(";", 1)[0]
            # application/octet-stream: bytes the pipeline itself carried as a data URL (pipeline/rows.py)
            if mime in ("", "application/octet-stream"):
                return f"<{size} bytes>"
            return f"<{mime} data URL, {size} bytes>"
        return value if len(value) <= 200 else f"{value[:197]}..."
    return _describe(value)


# -- what the engine takes -----------------------------------------------------------------------


def image_data_url(image: Image, options: ImageOptions = DEFAULT_OPTIONS) -> str:
    """The image encoded as a ``data:image/...;base64,`` URL."""
    buffer = io.BytesIO()
    if options.encode_format == "JPEG":
        image.save(buffer, format="JPEG", quality=options.jpeg_quality)
    else:
        image.save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"data:{_ENCODE_MIME[options.encode_format]};base64,{encoded}"


def image_content_part(image: Image, options: ImageOptions = DEFAULT_OPTIONS) -> dict[str, Any]:  # Any: JSON.
    """The OpenAI-style content part vLLM's chat parser and ray.data.llm take for one image."""
    return {"type": "image_url", "image_url": {"url": image_data_url(image, options)}}


def content_part_for(
    value: Any, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> dict[str, Any]:  # Any: a row's cell in, JSON out.
    """:func:`load_image` then :func:`image_content_part`: a row's image value -> its content part."""
    return image_content_part(load_image(value, options, relative_to), options)


def split_image_parts(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[Image]]:  # Any: JSON.
    """Messages with data-URL image parts -> (messages with ``{"type": "image"}`` parts, the images).

    This is the shape a model's chat template and ``multi_modal_data={"image": images}`` expect when
    the prompt is rendered without vLLM's chat parser (the HF chat templates of vision-language
    models render ``{"type": "image"}`` as their image placeholder). Only data URLs made by
    :func:`image_content_part` are decoded here; anything else raises ValueError.
    """
    images: list[Image] = []
    rendered: list[dict[str, Any]] = []  # Any: JSON.
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                if not isinstance(url, str) or not url.startswith(_DATA_URL_PREFIX):
                    raise _reason(BAD_VALUE_KIND, f"image part is not a data URL: {_describe(url)}")
                images.append(decode_image(_decode_data_url(url, DEFAULT_OPTIONS.max_bytes), _ANY_SIZE))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        rendered.append({**message, "content": parts})
    return rendered, images
