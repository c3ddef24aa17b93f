"""Turn one row's image value into a validated image for a vision-language model, or say why not.

A row's image may be a Hugging Face image struct (``{"bytes": b"...", "path": ...}`` as image
datasets store it in Parquet), raw bytes, a ``data:image/...;base64,`` URL, a local path, a
``file://`` / ``s3://`` URI (read through pyarrow's filesystems, as :mod:`.storage` does), an
``http(s)://`` URL (fetched with a deadline for the whole fetch and a size cap) or, in messages a
preprocess returns, a PIL image. :func:`load_image` reads it, checks it with Pillow (identify, verify,
decode, size limits), applies the EXIF orientation, converts it to RGB (transparent pixels over
white) and resizes it to bound the vision-token budget.

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
import binascii
import contextlib
import functools
import http.client
import io
import math
import os
import reprlib
import socket
import ssl
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
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
#: The bytes are over ``max_bytes``, the pixels over ``max_pixels`` (decompression bombs), or the
#: encoding for the engine over ``max_output_bytes``.
TOO_LARGE_KIND = "image too large"
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

_DATA_URL_PREFIX = "data:"
_HTTP_SCHEMES = ("http://", "https://")
_CHUNK_BYTES = 1 << 16
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
    :param timeout_seconds: deadline for reading one URL, the whole fetch (default 20 s).
    :param encode_format: how images are encoded for the engine: ``"auto"`` (default: a JPEG stays a
        JPEG, anything else becomes PNG, or JPEG where the PNG is over ``max_output_bytes``),
        ``"PNG"`` (lossless) or ``"JPEG"`` (smallest).
    :param jpeg_quality: JPEG quality, 1 to 100 (default 95).
    :param max_output_pixels: with neither ``size`` nor ``max_side``, shrink (never enlarge) to at
        most this many pixels, keeping the aspect ratio (default ``DEFAULT_MAX_OUTPUT_PIXELS``, 4 Mi).
    :param max_output_bytes: refuse an image whose encoding for the engine is over this (default
        ``DEFAULT_MAX_OUTPUT_BYTES``, 16 MiB; at most ``PART_MAX_BYTES``).
    """

    size: tuple[int, int] | None = None
    max_side: int | None = None
    min_side: int = 8
    max_pixels: int = 64 * 1024 * 1024
    max_bytes: int = 32 * 1024 * 1024
    timeout_seconds: float = 20.0
    encode_format: str = "auto"
    jpeg_quality: int = 95
    max_output_pixels: int = DEFAULT_MAX_OUTPUT_PIXELS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES

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
            "max_output_pixels",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TypeError(f"{name}={value!r} is invalid: it must be >= 1.")
        for name, limit in (("max_output_pixels", PART_MAX_PIXELS), ("max_output_bytes", PART_MAX_BYTES)):
            if getattr(self, name) > limit:
                raise TypeError(f"{name}={getattr(self, name)!r} is invalid: at most {limit}.")
        if self.timeout_seconds <= 0:
            raise TypeError(f"timeout_seconds={self.timeout_seconds!r} is invalid: it must be > 0.")
        if self.encode_format not in _ENCODE_FORMATS:
            raise TypeError(
                f"encode_format={self.encode_format!r} is invalid: use one of {list(_ENCODE_FORMATS)}."
            )
        if not 1 <= self.jpeg_quality <= 100:
            raise TypeError(f"jpeg_quality={self.jpeg_quality!r} is invalid: use 1 to 100.")


DEFAULT_OPTIONS = ImageOptions()


class ImageError(ValueError):
    """A row's image (or messages) at fault: ``str()`` is the row's reason, ``"<kind>: <detail>"``.

    Every function here raises only this for a row's value; its own type lets the guards that turn
    any other failure into a reason pass it through unchanged.
    """


def _reason(kind: str, detail: str) -> ValueError:
    return ImageError(f"{kind}: {detail}")


def _located(err: ValueError, where: str) -> ValueError:
    """``err``'s reason with the place of the image in the messages after its kind."""
    kind, _, detail = str(err).partition(": ")
    return _reason(kind, f"{where}: {detail}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 60, 60, 4, 4


def _describe(value: Any) -> str:  # Any: whatever the row holds.
    """A short repr: a row's value may be megabytes, or nested deeper than repr() can go."""
    text = _REPR.repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _short(text: str, limit: int = 200) -> str:
    """A path or URL as a reason shows it: a row's value may be megabytes long."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _is_pil_image(value: Any) -> bool:  # Any: a row's value.
    module = sys.modules.get("PIL.Image")  # not imported yet: the value cannot be a PIL image
    return module is not None and isinstance(value, module.Image)


# -- reading the encoded bytes -------------------------------------------------------------------


def _read_capped(
    read: Callable[[int], bytes], where: str, max_bytes: int, deadline: float | None = None
) -> bytes:
    chunks, total = [], 0
    while chunk := read(_CHUNK_BYTES):
        total += len(chunk)
        if total > max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{_short(where)} is over max_bytes={max_bytes}")
        if deadline is not None and time.monotonic() > deadline:
            raise _reason(FETCH_KIND, f"{_short(where)}: timed out while reading")
        chunks.append(chunk)
    return b"".join(chunks)


def _read_local(path: str, max_bytes: int) -> bytes:
    """A local file's bytes. Regular files only: a FIFO would block the row forever, /dev/zero never end."""
    shown = _short(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise _reason(BAD_VALUE_KIND, f"{shown} is a folder, not an image file")
        if not stat.S_ISREG(mode):
            raise _reason(BAD_VALUE_KIND, f"{shown} is not a regular file")
        with open(path, "rb") as stream:
            return _read_capped(stream.read, path, max_bytes)
    except FileNotFoundError as err:
        raise _reason(MISSING_KIND, f"no such file: {shown}") from err
    except OSError as err:  # permission, a name too long, I/O
        raise _reason(FETCH_KIND, f"{shown}: {err.strerror or err}") from err
    except ImageError:
        raise
    except ValueError as err:  # a NUL byte, or text that is no file name (a lone surrogate)
        raise _reason(BAD_VALUE_KIND, f"cannot open {_describe(path)}: {err}") from err


def _read_uri(uri: str, max_bytes: int) -> bytes:
    from pyarrow import fs

    from airflow_provider_raybatch.pipeline import storage

    shown = _short(uri)
    try:
        filesystem, path = storage.filesystem(uri)
    except Exception as err:  # noqa: BLE001 - pyarrow.ArrowInvalid (unknown scheme), a bad bucket name, ...
        raise _reason(BAD_VALUE_KIND, f"cannot read {shown}: {_short(str(err))}") from err
    try:
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.NotFound:
            raise _reason(MISSING_KIND, f"no such object: {shown}")
        if info.type != fs.FileType.File:
            raise _reason(BAD_VALUE_KIND, f"{shown} is a folder, not an image file")
        if info.size is not None and info.size > max_bytes:
            raise _reason(TOO_LARGE_KIND, f"{shown} has {info.size} bytes, over max_bytes={max_bytes}")
        with filesystem.open_input_stream(path) as stream:
            return _read_capped(stream.read, uri, max_bytes)
    except ImageError:
        raise
    except Exception as err:  # noqa: BLE001 - access denied, network, throttling: any is this row's fetch failing
        raise _reason(FETCH_KIND, f"{shown}: {type(err).__name__}: {_short(str(err))}") from err


class _Deadline:
    """A fetch's deadline, kept by a timer thread that shuts the fetch's sockets down when it passes.

    A socket timeout bounds each read, not the fetch: a server that sends a byte every few seconds
    would hold the row (and its Ray worker) for hours. Shutting a socket down wakes a read blocked on it.
    Name resolution is the one step it cannot cut short (the system resolver's own timeouts bound it).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also on an SSLSocket: it leaves the TLS state to the reading thread.
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _WatchedConnection:
    """An http.client connection that hands its socket to the fetch's deadline once connected."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:  # Any: http.client's.
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._deadline.watch(self.sock)  # type: ignore[attr-defined]


class _HTTPConnection(_WatchedConnection, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_WatchedConnection, http.client.HTTPSConnection):
    pass


class _WatchedHandler:
    """urllib's HTTP(S) handler, opening watched connections (do_open is the seam urllib offers)."""

    def __init__(self, deadline: _Deadline, **kwargs: Any) -> None:  # Any: the urllib handler's own.
        super().__init__(**kwargs)
        self._deadline = deadline

    def do_open(self, http_class: type, req: urllib.request.Request, **kwargs: Any) -> Any:  # Any: urllib's.
        secure = issubclass(http_class, http.client.HTTPSConnection)
        watched = functools.partial(_HTTPSConnection if secure else _HTTPConnection, deadline=self._deadline)
        return super().do_open(watched, req, **kwargs)  # type: ignore[misc]


class _HTTPHandler(_WatchedHandler, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_WatchedHandler, urllib.request.HTTPSHandler):
    pass


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One context per process: loading the CA certificates for every image would cost more than its fetch."""
    return ssl.create_default_context()


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib with http(s) only: a redirect to ftp:// or file:// fails the fetch instead of following.

    Proxies come from the environment, as with urllib's default opener.
    """
    opener = urllib.request.OpenerDirector()
    handlers = (
        urllib.request.ProxyHandler(),
        urllib.request.UnknownHandler(),
        _HTTPHandler(deadline),
        _HTTPSHandler(deadline, context=_tls_context()),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPErrorProcessor(),
    )
    for handler in handlers:
        opener.add_handler(handler)
    return opener


def _declared_length(response: Any) -> int | None:  # Any: http.client.HTTPResponse.
    declared = response.headers.get("Content-Length") or ""
    return int(declared) if declared.isascii() and declared.isdigit() else None


def _fetch(url: str, max_bytes: int, deadline: _Deadline) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "airflow-provider-raybatch"})
    with _opener(deadline).open(request, timeout=deadline.seconds) as response:
        declared = _declared_length(response)
        if declared is not None and declared > max_bytes:
            raise _reason(
                TOO_LARGE_KIND, f"{_short(url)} declares {declared} bytes, over max_bytes={max_bytes}"
            )
        # read1: one recv at a time, so that the deadline is looked at between the bytes of a slow server.
        data = _read_capped(getattr(response, "read1", response.read), url, max_bytes, deadline.at)
    if deadline.expired:  # the timer shut the socket: what came is cut short
        raise _reason(FETCH_KIND, f"{_short(url)}: timed out after {deadline.seconds:g} s")
    if declared is not None and len(data) < declared:
        raise _reason(
            FETCH_KIND, f"{_short(url)}: the connection closed after {len(data)} of {declared} bytes"
        )
    return data


def _fetch_failure(err: Exception, deadline: _Deadline) -> str:
    if deadline.expired:
        return f"timed out after {deadline.seconds:g} s"
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {_short(str(err.reason))}"
    if isinstance(err, urllib.error.URLError):
        if not isinstance(err.reason, BaseException):
            return _short(str(err.reason))
        err = err.reason  # type: ignore[assignment]
    return f"{type(err).__name__}: {_short(str(err))}"


def _read_http(url: str, max_bytes: int, timeout_seconds: float) -> bytes:
    """The bytes at ``url``; every failure of the fetch is this row's ``image fetch failed``.

    urllib, http.client, ssl and socket raise a dozen types (InvalidURL for a space, BadStatusLine,
    IncompleteRead, RemoteDisconnected, LineTooLong, timeouts, UnicodeError for a host, OverflowError
    for a port): none of them may fail the job.
    """
    deadline = _Deadline(timeout_seconds)
    try:
        with deadline:
            return _fetch(url, max_bytes, deadline)
    except ImageError:
        raise
    except Exception as err:  # noqa: BLE001 - a row's fetch failing fails that row, never the job
        raise _reason(FETCH_KIND, f"{_short(url)}: {_fetch_failure(err, deadline)}") from err


def _decode_data_url(url: str, max_bytes: int) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise _reason(BAD_VALUE_KIND, f"a data URL must be data:<mime>;base64,<data>, got {_describe(url)}")
    size = len(payload) * 3 // 4 - (len(payload) - len(payload.rstrip("=")))  # the decoded size
    if size > max_bytes:
        raise _reason(TOO_LARGE_KIND, f"data URL of ~{size} bytes, over max_bytes={max_bytes}")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:  # ValueError: text that is not ASCII
        raise _reason(BAD_VALUE_KIND, f"data URL is not valid base64: {_short(str(err))}") from err


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
        return _read_struct(value, options, relative_to)
    raise _reason(BAD_VALUE_KIND, f"cannot read an image from a {type(value).__name__}: {_describe(value)}")


def _read_struct(
    value: dict[Any, Any], options: ImageOptions, relative_to: str | None
) -> bytes:  # Any: a Hugging Face image struct, or whatever dict the row holds.
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
    return _decode(data, options)[0]


def _decode(data: bytes, options: ImageOptions) -> tuple[Image, str | None]:
    """The decoded RGB image and the format it was stored in (which :func:`image_data_url` keeps)."""
    from PIL import ImageOps

    if not data:
        raise _reason(BAD_IMAGE_KIND, "empty bytes")
    with _pillow_errors(), _open(data) as probe:  # reads the header only
        size, source_format = probe.size, probe.format
    _check_dimensions(size, options)  # before decoding a single pixel: bombs stop here
    with _pillow_errors():
        with _open(data) as probe:
            probe.verify()  # structure and checksums, without decoding the pixels
        image = _open(data)  # verify() leaves an image unusable: reopen
        image.load()  # decodes the pixels: truncated data fails here
        image = ImageOps.exif_transpose(image)  # phone photos carry their rotation in EXIF
        return _to_rgb(image), source_format


def _from_pil(image: Image, options: ImageOptions) -> tuple[Image, str | None]:
    """A PIL image a preprocess made, held to the same checks as decoded bytes."""
    from PIL import ImageOps

    source_format = image.format
    with _pillow_errors():
        size = image.size
    _check_dimensions(size, options)
    with _pillow_errors():
        image.load()  # an image opened lazily from a file decodes here
        return _to_rgb(ImageOps.exif_transpose(image)), source_format


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
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PILImage.alpha_composite(background, rgba).convert("RGB")
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
    from PIL import Image as PILImage

    target = _target_size(image.size, options)
    if target == image.size:
        return image
    return image.resize(target, PILImage.Resampling.BICUBIC)


def _load(
    value: Any, options: ImageOptions, relative_to: str | None
) -> tuple[Image, str | None]:  # Any: a cell.
    if _is_pil_image(value):
        image, source_format = _from_pil(value, options)
    else:
        image, source_format = _decode(read_image_bytes(value, options, relative_to), options)
    with _pillow_errors():
        return resize_image(image, options), source_format


def load_image(
    value: Any, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> Image:  # Any: a cell.
    """A row's image value (or a PIL image) -> a checked, RGB, resized PIL image; raises ValueError."""
    return _load(value, options, relative_to)[0]


def describe_image_value(value: Any) -> Any:  # Any: a row's cell in, a JSON value out.
    """A short stand-in for a row's image value, to show in error rows instead of megabytes of bytes.

    Bytes and data URLs become ``"<N bytes>"``; a PIL image ``"<WxH MODE image>"``; paths and URLs stay
    (truncated), as they say where the image is; an image struct keeps its shape with its parts described.
    """
    return _described_value(value, depth=0)


def _described_value(value: Any, depth: int) -> Any:  # Any: a cell in, a JSON value out.
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


def _described_data_url(url: str) -> str:
    header, _, payload = url.partition(",")
    size = len(payload) * 3 // 4 - len(payload) + len(payload.rstrip("="))  # the decoded size
    mime = _short(header.removeprefix(_DATA_URL_PREFIX).split(";", 1)[0], 60)
    # application/octet-stream: bytes the pipeline itself carried as a data URL (pipeline/rows.py)
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
) -> dict[str, Any]:  # Any: JSON.
    """The OpenAI-style content part vLLM's chat parser and ray.data.llm take for one image.

    Raises ValueError (``image too large``) rather than return a part :func:`split_image_parts` refuses.
    """
    return {"type": "image_url", "image_url": {"url": image_data_url(image, options, source_format)}}


def content_part_for(
    value: Any, options: ImageOptions = DEFAULT_OPTIONS, relative_to: str | None = None
) -> dict[str, Any]:  # Any: a row's cell (or a PIL image) in, JSON out.
    """:func:`load_image` then :func:`image_content_part`: a row's image value -> its content part.

    Everything that can fail for a row's image fails here, where the row is prepared, as a ValueError
    with the reason; the part it returns is one :func:`split_image_parts` always decodes.
    """
    image, source_format = _load(value, options, relative_to)
    return image_content_part(image, options, source_format)


#: How split_image_parts decodes the parts: any size this module may have produced.
_PART_OPTIONS = ImageOptions(min_side=1, max_pixels=PART_MAX_PIXELS, max_bytes=PART_MAX_BYTES)


def split_image_parts(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[Image]]:  # Any: JSON.
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
    rendered: list[dict[str, Any]] = []  # Any: JSON.
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


def _split_part(where: str, part: Any, images: list[Image]) -> Any:  # Any: a content part.
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
    messages: Any,
    options: ImageOptions = DEFAULT_OPTIONS,
    relative_to: str | None = None,
    *,
    max_images: int = DEFAULT_MAX_IMAGES,
) -> list[dict[str, Any]]:  # Any: what a preprocess returned in, JSON out.
    """A copy of chat messages with every image part replaced by its canonical content part.

    A preprocess written for Ray Data LLM returns images as ``{"type": "image", "image": <PIL image,
    bytes, a data: URL, a path, an http(s)://, s3:// or file:// URL>}`` or OpenAI's ``{"type":
    "image_url", "image_url": {"url": ...}}`` (or ``"image_url": "<url>"``). Each is read, checked and
    encoded as :func:`content_part_for` does for ``image_column``, so that the messages are JSON and
    :func:`split_image_parts` decodes them for the engine. Text parts and text contents pass unchanged.

    :param relative_to: folder that relative paths are resolved against (the input file's).
    :param max_images: image parts allowed in one row's messages; more fail the row before any is read.
    :raises ValueError: ``bad messages: message 0 part 1: ...`` for what is not a message or a part;
        an image's own reason with its place, e.g. ``bad image: message 0 part 1: ...``.
    """
    _check_messages(messages, max_images)  # before any image is read: a bad part fails fast
    return [
        _normalized_message(index, message, options, relative_to) for index, message in enumerate(messages)
    ]


def _check_messages(messages: Any, max_images: int) -> None:  # Any: what a preprocess returned.
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


def _content_parts(index: int, message: Any) -> list[tuple[str, Any]]:  # Any: JSON-ish.
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


def _image_value(where: str, part: Any) -> Any:  # Any: a content part in, its image value out.
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
    index: int, message: dict[str, Any], options: ImageOptions, relative_to: str | None
) -> dict[str, Any]:  # Any: JSON.
    parts = _content_parts(index, message)
    if not parts:
        return dict(message)
    content = [_normalized_part(where, part, options, relative_to) for where, part in parts]
    return {**message, "content": content}


def _normalized_part(
    where: str, part: dict[str, Any], options: ImageOptions, relative_to: str | None
) -> dict[str, Any]:  # Any: JSON.
    value = _image_value(where, part)
    if value is _TEXT:
        return dict(part)
    try:
        return content_part_for(value, options, relative_to)
    except ValueError as err:
        raise _located(err, where) from err


def describe_message_images(messages: Any) -> Any:  # Any: any messages in, a JSON value out.
    """A copy of chat messages with each image replaced by a short description (:func:`describe_image_value`).

    For error rows and outputs, which must never carry image bytes. Takes anything (it runs on rows
    whose messages were malformed too): bytes and PIL images anywhere are described; text is kept.
    """
    if not isinstance(messages, list):
        return _scrubbed(messages, depth=0)
    return [_described_message(message) for message in messages]


def _described_message(message: Any) -> Any:  # Any: a message in, a JSON value out.
    if not isinstance(message, dict):
        return _scrubbed(message, depth=1)
    described = {str(key): _scrubbed(value, depth=1) for key, value in message.items() if key != "content"}
    content = message.get("content")
    if isinstance(content, list):
        described["content"] = [_described_part(part) for part in content]
    elif "content" in message:
        described["content"] = _scrubbed(content, depth=1)
    return described


def _described_part(part: Any) -> Any:  # Any: a content part in, a JSON value out.
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


def _scrubbed(value: Any, depth: int) -> Any:  # Any: any value in, a JSON value out.
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
