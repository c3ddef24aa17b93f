"""Tests of airflow_provider_raybatch/pipeline/read/images.py: a row's image for the engine, or why not.

The corrupt-image corpus is made here, in memory and under tmp_path; URLs are served by a local
HTTP server on 127.0.0.1 (no network). Needs Pillow (it comes with vLLM on the cluster side).

These tests are about reading, checking and encoding an image, so most of them read with ``OPEN``,
a policy that allows the loopback test servers and any local path; where images may come from is
tested in tests/security/test_image_fetch.py (and the defaults' refusals here, where a test meets them).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import io
import json
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from PIL import Image
except ImportError:  # not importorskip: without Pillow these tests must fail, not vanish (see _needs_pillow)
    Image = None  # type: ignore[assignment]
try:
    from hypothesis import event, given, settings
    from hypothesis import strategies as st
except ImportError:  # not importorskip either: see _needs_hypothesis
    event = given = settings = st = None  # type: ignore[assignment]

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import images
from airflow_provider_raybatch.pipeline.read.images import (
    BAD_IMAGE_KIND,
    BAD_VALUE_KIND,
    FETCH_KIND,
    MISSING_KIND,
    NOT_ALLOWED_KIND,
    TOO_LARGE_KIND,
    TOO_SMALL_KIND,
    ImageOptions,
    ImageSources,
    content_part_for,
    image_content_part,
    load_image,
    read_image_bytes,
    split_image_parts,
)
from airflow_provider_raybatch.pipeline.stage.commit import reason_kind


def encode(image: Image.Image, fmt: str = "PNG", **params: Any) -> bytes:  # Any: Pillow save options.
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares the given size and holds no pixels: a bomb's or a broken file's shape."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


RGB_PNG = encode(Image.new("RGB", (40, 30), (200, 10, 10))) if Image else b""
#: Where these tests may read images from: the loopback test servers and any local path.
OPEN = ImageSources(allowed_hosts=("127.0.0.0/8",), allowed_local_path="/")
OPEN_OPTIONS = ImageOptions(sources=OPEN)
RGB_JPEG = encode(Image.new("RGB", (64, 48), (10, 200, 10)), "JPEG", quality=90) if Image else b""


@pytest.fixture(autouse=True)
def _needs_pillow() -> None:
    if Image is None:
        pytest.fail(
            "Pillow is not importable here. The cluster side has it (vLLM depends on it); for the unit tests "
            "add 'pillow' to the [test] extra in pyproject.toml."
        )


def kind_of(value: Any, **options: Any) -> str:  # Any: a row's cell; ImageOptions fields.
    with pytest.raises(ValueError) as caught:
        load_image(value, ImageOptions(**{"sources": OPEN, **options}))
    reason = str(caught.value)
    assert reason.startswith(reason_kind(reason) + ": ") and len(reason) > len(reason_kind(reason)) + 2
    return reason_kind(reason)


# -- good images ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "size"),
    [
        (("RGB", (40, 30), "red"), (40, 30)),
        (("L", (20, 10), 128), (20, 10)),
        (("RGBA", (16, 16), (0, 0, 255, 255)), (16, 16)),
        (("P", (12, 9), 0), (12, 9)),
        (("CMYK", (10, 10), (0, 0, 0, 0)), (10, 10)),
        (("I;16", (10, 10), 1000), (10, 10)),
    ],
    ids=["rgb", "grayscale", "rgba", "palette", "cmyk", "16-bit"],
)
def test_good_image_becomes_rgb(
    source: tuple[Any, ...], size: tuple[int, int]
) -> None:  # Any: Image.new args.
    mode = source[0]
    image = load_image(encode(Image.new(*source), "JPEG" if mode == "CMYK" else "PNG"))

    assert image.mode == "RGB"
    assert image.size == size


def test_jpeg_keeps_its_pixels() -> None:
    image = load_image(RGB_JPEG)

    assert image.size == (64, 48)
    red, green, blue = image.getpixel((32, 24))
    assert green > 180 and red < 40 and blue < 40


def test_transparent_pixels_become_white_not_black() -> None:
    rgba = Image.new("RGBA", (10, 10), (0, 0, 0, 0))
    rgba.putpixel((0, 0), (255, 0, 0, 255))

    image = load_image(encode(rgba))

    assert image.getpixel((5, 5)) == (255, 255, 255)
    assert image.getpixel((0, 0)) == (255, 0, 0)


def test_palette_with_transparency_becomes_white() -> None:
    palette = Image.new("P", (10, 10), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    palette.info["transparency"] = 0

    assert load_image(encode(palette, transparency=0)).getpixel((1, 1)) == (255, 255, 255)


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    data = encode(Image.new("RGB", (40, 20), "blue"), "JPEG", exif=exif.tobytes())

    assert load_image(data).size == (20, 40)


def test_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("P", (20, 20), i) for i in range(3)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])

    assert load_image(data).size == (20, 20)


def test_bytearray_and_memoryview_are_bytes() -> None:
    assert load_image(bytearray(RGB_PNG)).size == (40, 30)
    assert load_image(memoryview(RGB_PNG)).size == (40, 30)


# -- where the bytes come from -------------------------------------------------------------------


def test_hugging_face_image_struct_with_bytes() -> None:
    assert load_image({"bytes": RGB_PNG, "path": "ignored.png"}).size == (40, 30)


def test_hugging_face_image_struct_with_path_only(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(RGB_PNG)
    struct = {"bytes": None, "path": str(tmp_path / "a.png")}

    assert load_image(struct, relative_to=str(tmp_path)).size == (40, 30)


def test_hugging_face_image_struct_read_back_from_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": RGB_JPEG, "path": "x.jpg"}], type=image_type)})
    pq.write_table(table, tmp_path / "images.parquet")

    (cell,) = pq.read_table(tmp_path / "images.parquet").column("image").to_pylist()

    assert load_image(cell).size == (64, 48)


def test_local_path_str_and_pathlike(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(RGB_JPEG)

    assert load_image(str(tmp_path / "a.jpg"), relative_to=str(tmp_path)).size == (64, 48)
    assert load_image(tmp_path / "a.jpg", relative_to=str(tmp_path)).size == (64, 48)


def test_relative_path_resolves_against_relative_to(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(RGB_PNG)

    assert load_image("imgs/a.png", relative_to=str(tmp_path)).size == (40, 30)
    assert load_image({"bytes": None, "path": "imgs/a.png"}, relative_to=str(tmp_path)).size == (40, 30)
    assert load_image("imgs/a.png", relative_to=f"file://{tmp_path}").size == (40, 30)


def test_file_uri_reads_through_pyarrow(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(RGB_PNG)

    assert load_image(f"file://{tmp_path}/a.png", relative_to=str(tmp_path)).size == (40, 30)
    assert kind_of(f"file://{tmp_path}/nope.png") == MISSING_KIND


def test_s3_uri_reads_through_the_storage_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyarrow import fs

    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "a.png").write_bytes(RGB_PNG)
    seen = []

    def fake_filesystem(uri: str) -> tuple[Any, str]:  # Any: a pyarrow filesystem.
        seen.append(uri)
        return fs.LocalFileSystem(), str(tmp_path) + "/" + uri.removeprefix("s3://")

    monkeypatch.setattr(storage, "filesystem", fake_filesystem)

    assert load_image("s3://bucket/a.png", relative_to="s3://bucket").size == (40, 30)
    in_bucket = ImageSources(allowed_s3_prefixes=("s3://bucket",))
    assert kind_of("s3://bucket/missing.png", sources=in_bucket) == MISSING_KIND
    assert kind_of("s3://bucket", sources=in_bucket) == BAD_VALUE_KIND
    assert kind_of("s3://bucket/a.png", max_bytes=10, sources=in_bucket) == TOO_LARGE_KIND
    assert seen[0] == "s3://bucket/a.png"


def test_data_url() -> None:
    url = "data:image/png;base64," + base64.b64encode(RGB_PNG).decode()

    assert load_image(url).size == (40, 30)
    assert load_image({"bytes": url}).size == (40, 30)
    assert kind_of("data:image/png;base64,@@@") == BAD_VALUE_KIND
    assert kind_of("data:image/png," + "x") == BAD_VALUE_KIND


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/slow.png":
            time.sleep(1.5)
        if self.path in ("/ok.png", "/slow.png"):
            self._send(200, RGB_PNG)
        elif self.path == "/huge.png":
            self.send_response(200)
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
        elif self.path == "/html":
            self._send(200, b"<html>not an image</html>")
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up first (the timeout case)
            pass

    def log_message(self, *args: Any) -> None:  # Any: the stdlib's signature; keep the test log quiet
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_url(http_base: str) -> None:
    assert load_image(f"{http_base}/ok.png", OPEN_OPTIONS).size == (40, 30)


@pytest.mark.parametrize(
    ("path", "options", "kind", "detail"),
    [
        ("/missing.png", {}, FETCH_KIND, "HTTP 404"),
        ("/huge.png", {}, TOO_LARGE_KIND, "declares 1000000000 bytes"),
        ("/ok.png", {"max_bytes": 100}, TOO_LARGE_KIND, "over max_bytes=100"),
        ("/slow.png", {"timeout_seconds": 0.3}, FETCH_KIND, "timed out"),
        ("/html", {}, BAD_IMAGE_KIND, "cannot identify image file"),
    ],
)
def test_http_failures(http_base: str, path: str, options: dict[str, Any], kind: str, detail: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_image(http_base + path, ImageOptions(sources=OPEN, **options))

    assert reason_kind(str(caught.value)) == kind
    assert detail in str(caught.value)


def test_http_connection_refused() -> None:
    with pytest.raises(ValueError, match=r"^image fetch failed: http://127\.0\.0\.1:9/a\.png: "):
        load_image("http://127.0.0.1:9/a.png", ImageOptions(timeout_seconds=2, sources=OPEN))


# -- servers that misbehave: every failure of a fetch is the row's reason, never the job's ------------


def _read_request_head(connection: socket.socket) -> str:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = connection.recv(4096)
        if not chunk:
            break
        head += chunk
    return head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"


def _drip(connection: socket.socket, data: bytes, seconds_per_byte: float, for_seconds: float) -> None:
    """Send a byte at a time, slower than any read wants and faster than any socket timeout fires."""
    stop_at = time.monotonic() + for_seconds
    for byte in data:
        if time.monotonic() > stop_at:
            return
        connection.sendall(bytes([byte]))
        time.sleep(seconds_per_byte)


def _png_head(length: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {length}\r\n\r\n".encode()


_MISBEHAVIOURS = {
    "/bad-status-line": lambda c: c.sendall(b"HELLO WORLD\r\n\r\n"),
    "/no-response": lambda c: None,  # closes without a word: RemoteDisconnected
    "/closes-mid-body": lambda c: c.sendall(_png_head(len(RGB_PNG)) + RGB_PNG[:50]),
    "/declares-more-and-hangs": lambda c: (c.sendall(_png_head(10_000) + RGB_PNG), time.sleep(3)),
    "/bad-chunk-size": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + RGB_PNG
    ),
    "/chunk-cut-short": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n" + RGB_PNG[:10]
    ),
    "/header-too-long": lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n"),
    "/too-many-headers": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n"
    ),
    "/drips-headers": lambda c: _drip(c, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 200, 0.05, 3),
    "/drips-body": lambda c: (c.sendall(_png_head(len(RGB_PNG))), _drip(c, RGB_PNG, 0.05, 3)),
    "/redirects-to-ftp": lambda c: c.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1:9/a.png\r\nContent-Length: 0\r\n\r\n"
    ),
    "/redirects-to-file": lambda c: c.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: file:///etc/hostname\r\nContent-Length: 0\r\n\r\n"
    ),
    "/odd-content-length": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\nConnection: close\r\n\r\n" + RGB_PNG
    ),
}


class _Misbehaving(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        path = _read_request_head(self.request)
        with contextlib.suppress(OSError):  # the client gave up first (the timeout cases)
            _MISBEHAVIOURS.get(path, lambda c: c.sendall(_png_head(len(RGB_PNG)) + RGB_PNG))(self.request)


@pytest.fixture(scope="module")
def bad_base() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Misbehaving)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def within(seconds: float, call: Any) -> Any:  # Any: a function of no arguments and its result.
    """call() in a daemon thread; fails the test if it has not returned within ``seconds`` (a hang)."""
    result: list[Any] = []  # Any: the call's result or what it raised.

    def run() -> None:
        try:
            result.append(call())
        except BaseException as err:  # noqa: BLE001 - handed back to the test thread
            result.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still running after {seconds} s"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def fetch_reason(url: str, timeout_seconds: float = 5.0) -> tuple[str, float]:
    """load_image's reason for ``url`` and how long it took; anything else it raises fails the test."""

    def reason() -> str:
        with pytest.raises(ValueError) as caught:
            load_image(url, ImageOptions(timeout_seconds=timeout_seconds, sources=OPEN))
        return str(caught.value)

    started = time.monotonic()
    return within(timeout_seconds + 5, reason), time.monotonic() - started


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/bad-status-line", "BadStatusLine"),
        ("/no-response", "RemoteDisconnected"),
        ("/closes-mid-body", f"closed after 50 of {len(RGB_PNG)} bytes"),
        ("/bad-chunk-size", "IncompleteRead"),
        ("/chunk-cut-short", "IncompleteRead"),
        ("/header-too-long", "LineTooLong"),
        ("/too-many-headers", "HTTPException"),
        ("/redirects-to-ftp", "unknown url type: ftp"),
        ("/redirects-to-file", "not allowed"),
    ],
)
def test_a_misbehaving_server_fails_the_row(bad_base: str, path: str, detail: str) -> None:
    reason, _ = fetch_reason(bad_base + path)

    assert reason.startswith(f"{FETCH_KIND}: {bad_base}{path}: ")
    assert detail in reason


@pytest.mark.parametrize("path", ["/declares-more-and-hangs", "/drips-headers", "/drips-body"])
def test_a_fetch_ends_at_its_deadline_however_slowly_the_server_sends(bad_base: str, path: str) -> None:
    """Socket timeouts bound each read, not the fetch: a byte every 50 ms would hold a row for hours."""
    reason, took = fetch_reason(bad_base + path, timeout_seconds=0.5)

    assert reason.startswith(f"{FETCH_KIND}: {bad_base}{path}: ") and "timed out" in reason
    assert took < 2.0


def test_an_unreadable_content_length_is_ignored(bad_base: str) -> None:
    assert load_image(bad_base + "/odd-content-length", OPEN_OPTIONS).size == (40, 30)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/a b.png",  # a space: http.client.InvalidURL
        "http://127.0.0.1:{port}/caf\u00e9.png",  # not ASCII: UnicodeEncodeError
        "http://127.0.0.1:{port}/a.png\r\nX-Injected: 1",  # a header injection: InvalidURL
        "http://127.0.0.1:99999/a.png",  # OverflowError
        "http://127.0.0.1:port/a.png",  # nonnumeric port: InvalidURL
        "http://[::1/a.png",  # unbalanced bracket: ValueError
        "http:///a.png",  # no host
        "http://" + "a" * 64 + "/a.png",  # a host label over 63 characters: UnicodeError
        "https://127.0.0.1:{port}/a.png",  # TLS to a server that speaks plain HTTP: SSLError
    ],
    ids=[
        "space",
        "non-ascii",
        "crlf",
        "port-overflow",
        "port-not-a-number",
        "bad-ipv6",
        "no-host",
        "long-label",
        "tls-to-plain-http",
    ],
)
def test_a_url_that_cannot_be_requested_fails_the_row(bad_base: str, url: str) -> None:
    url = url.replace("{port}", bad_base.rsplit(":", 1)[1])

    reason, _ = fetch_reason(url)

    assert reason.startswith(f"{FETCH_KIND}: http")
    assert len(reason) < 400


def test_a_long_url_is_shortened_in_the_reason() -> None:
    reason, _ = fetch_reason("http://127.0.0.1:9/" + "a" * 5000 + " b.png")

    assert reason.startswith(f"{FETCH_KIND}: http://127.0.0.1:9/aaa") and len(reason) < 600


def test_reading_a_local_path_that_cannot_be_opened_fails_the_row(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # open() on a FIFO blocks until a writer comes: never, for an image column

    assert within(5, lambda: kind_of(str(fifo))) == BAD_VALUE_KIND
    assert kind_of("a\x00b.png") == BAD_VALUE_KIND
    assert kind_of("a\ud800.png") == BAD_VALUE_KIND
    assert kind_of("x" * 5000 + ".png") == FETCH_KIND  # ENAMETOOLONG
    assert kind_of("/dev/zero") == BAD_VALUE_KIND  # endless: not a regular file


def test_a_file_swapped_for_a_fifo_after_its_check_fails_the_row_not_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer of the input folder renames a FIFO over an image between the reader's look and its
    open (a race a trial won in under a second): the look here says a regular file, the name is a FIFO
    by the open. The row fails at once; an open that waited for the FIFO's writer hung the job."""
    fifo = tmp_path / "a.png"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    real_stat = os.stat
    monkeypatch.setattr(
        os, "stat", lambda path, *a, **k: regular if str(path) == str(fifo) else real_stat(path, *a, **k)
    )

    assert within(5, lambda: kind_of(str(fifo))) == BAD_VALUE_KIND


# -- the corrupt corpus --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "options", "kind"),
    [
        (lambda: RGB_PNG[: len(RGB_PNG) // 2], {}, BAD_IMAGE_KIND),
        (lambda: RGB_JPEG[: len(RGB_JPEG) - 40], {}, BAD_IMAGE_KIND),
        (bytes(range(256)) * 4, {}, BAD_IMAGE_KIND),
        (b"", {}, BAD_IMAGE_KIND),
        (b"hello, this is text\n", {}, BAD_IMAGE_KIND),
        (png_header_only(0, 0), {}, BAD_IMAGE_KIND),
        (png_header_only(0, 5), {}, BAD_IMAGE_KIND),
        (lambda: encode(Image.new("RGB", (1, 1))), {}, TOO_SMALL_KIND),
        (lambda: encode(Image.new("RGB", (100, 4))), {}, TOO_SMALL_KIND),
        (png_header_only(100_000, 100_000), {}, TOO_LARGE_KIND),
        (png_header_only(9000, 9000), {}, TOO_LARGE_KIND),
        (lambda: RGB_PNG, {"max_pixels": 100}, TOO_LARGE_KIND),
        (lambda: RGB_PNG, {"max_bytes": 10}, TOO_LARGE_KIND),
        (lambda: encode(Image.new("RGB", (10, 10)), "ICO"), {}, BAD_IMAGE_KIND),
        ({"foo": b"x"}, {}, BAD_VALUE_KIND),
        ({"bytes": "not bytes"}, {}, BAD_VALUE_KIND),
        ({"bytes": None, "path": None}, {}, MISSING_KIND),
        ({"bytes": None, "path": ""}, {}, MISSING_KIND),
        ({"bytes": None, "path": "/no/such/image.png"}, {}, MISSING_KIND),
        ("/no/such/image.png", {}, MISSING_KIND),
        ("", {}, MISSING_KIND),
        ("   ", {}, MISSING_KIND),
        (None, {}, MISSING_KIND),
        (42, {}, BAD_VALUE_KIND),
        ([b"x"], {}, BAD_VALUE_KIND),
        ("ftp://example.com/a.png", {}, BAD_VALUE_KIND),
    ],
    ids=[
        "truncated-png",
        "truncated-jpeg",
        "random-bytes",
        "empty-bytes",
        "text",
        "zero-pixels",
        "zero-width",
        "1x1",
        "thin-strip",
        "declared-10g-pixels",
        "over-default-max-pixels",
        "over-max-pixels",
        "over-max-bytes",
        "unaccepted-format",
        "wrong-dict-shape",
        "dict-bytes-not-bytes",
        "dict-empty",
        "dict-empty-path",
        "dict-missing-path",
        "missing-path",
        "empty-str",
        "blank-str",
        "none",
        "int",
        "list",
        "unsupported-scheme",
    ],
)
def test_corrupt_corpus(value: Any, options: dict[str, Any], kind: str) -> None:  # Any: a row's cell.
    value = value() if callable(value) else value  # factories: values built with Pillow

    assert kind_of(value, **options) == kind


def test_reasons_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "folder").mkdir()

    def reason(value: Any, **options: Any) -> str:  # Any: a row's cell; ImageOptions fields.
        with pytest.raises(ValueError) as caught:
            load_image(value, ImageOptions(sources=OPEN, **options))
        return str(caught.value)

    assert reason(str(tmp_path / "notes.txt")).startswith("bad image: cannot identify image file")
    assert reason(b"") == "bad image: empty bytes"
    assert reason(None) == "missing image: the image value is None"
    assert reason("/no/such.png") == "missing image: no such file: /no/such.png"
    assert (
        reason(str(tmp_path / "folder"))
        == f"bad image value: {tmp_path / 'folder'} is a folder, not an image file"
    )
    assert reason(encode(Image.new("RGB", (1, 1)))) == "image too small: 1x1 pixels, a side under min_side=8"
    assert reason(RGB_PNG, max_pixels=100) == "image too large: 40x30 pixels, over max_pixels=100"
    assert reason({"foo": 1}) == "bad image value: an image dict needs 'bytes' or 'path', got keys ['foo']"
    assert reason(42) == "bad image value: cannot read an image from a int: 42"
    assert reason(png_header_only(0, 0)).startswith("bad image: ")


def test_min_side_can_be_lowered() -> None:
    assert load_image(encode(Image.new("RGB", (1, 1))), ImageOptions(min_side=1)).size == (1, 1)


def test_read_image_bytes_returns_the_encoded_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(RGB_PNG)

    assert read_image_bytes(str(tmp_path / "a.png"), relative_to=str(tmp_path)) == RGB_PNG
    assert read_image_bytes({"bytes": RGB_JPEG}) == RGB_JPEG


# -- resizing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "options", "size"),
    [
        ((200, 100), {"size": (32, 24)}, (32, 24)),
        ((20, 10), {"size": (64, 64)}, (64, 64)),
        ((200, 100), {"max_side": 50}, (50, 25)),
        ((100, 300), {"max_side": 64}, (21, 64)),
        ((40, 30), {"max_side": 64}, (40, 30)),
        ((1000, 9), {"max_side": 100, "min_side": 1}, (100, 1)),
        ((200, 100), {}, (200, 100)),
    ],
    ids=[
        "fixed",
        "fixed-enlarges",
        "max-side-wide",
        "max-side-tall",
        "max-side-never-enlarges",
        "max-side-keeps-one-pixel",
        "unchanged",
    ],
)
def test_resize(source: tuple[int, int], options: dict[str, Any], size: tuple[int, int]) -> None:
    image = load_image(encode(Image.new("RGB", source, "white")), ImageOptions(**options))

    assert image.size == size


@pytest.mark.parametrize(
    "options",
    [
        {"size": (10, 10), "max_side": 10},
        {"size": (0, 10)},
        {"size": (10,)},
        {"max_side": 0},
        {"min_side": 0},
        {"max_pixels": 0},
        {"max_bytes": -1},
        {"timeout_seconds": 0},
        {"encode_format": "GIF"},
    ],
)
def test_bad_options_are_a_type_error_not_a_row_reason(options: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        ImageOptions(**options)


# -- what the engine gets ------------------------------------------------------------------------


def test_content_part_is_a_json_data_url_part() -> None:
    part = content_part_for(RGB_JPEG, ImageOptions(max_side=32))

    assert json.loads(json.dumps(part)) == part
    assert part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")  # a JPEG stays a JPEG (encode_format="auto")
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert (decoded.format, decoded.mode, decoded.size) == ("JPEG", "RGB", (32, 24))


def test_content_part_as_jpeg() -> None:
    part = image_content_part(Image.new("RGB", (16, 16), "red"), ImageOptions(encode_format="JPEG"))

    assert part["image_url"]["url"].startswith("data:image/jpeg;base64,/9j/")


def test_content_part_round_trips_through_load_image() -> None:
    part = content_part_for(RGB_PNG)

    assert load_image(part["image_url"]["url"]).tobytes() == load_image(RGB_PNG).tobytes()


def test_split_image_parts_gives_placeholders_and_images() -> None:
    part = content_part_for(RGB_PNG)
    messages = [
        {"role": "system", "content": "Caption images."},
        {"role": "user", "content": [part, {"type": "text", "text": "Describe it."}, part]},
    ]

    rendered, found = split_image_parts(messages)

    assert rendered == [
        {"role": "system", "content": "Caption images."},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}, {"type": "image"}],
        },
    ]
    assert [(image.mode, image.size) for image in found] == [("RGB", (40, 30))] * 2
    assert messages[1]["content"][0] is part  # the input is left as it was


def test_split_image_parts_refuses_remote_urls() -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]

    with pytest.raises(ValueError, match="^bad image value: message 0 part 0: image part is not a data URL"):
        split_image_parts(messages)


# -- what the engine gets is bounded, and checked where the row is prepared -------------------------


def big_photo(width: int = 8000, height: int = 6000) -> bytes:
    """A photo-like JPEG: smooth colour blobs (noise scaled up), small as JPEG and huge as PNG."""
    small = Image.merge("RGB", [Image.effect_noise((width // 40, height // 40), 60) for _ in range(3)])
    return encode(small.resize((width, height), Image.Resampling.BILINEAR), "JPEG", quality=85)


@pytest.fixture(scope="module")
def photo_8000x6000() -> bytes:
    return big_photo() if Image else b""


def one_part(part: Any) -> list[dict[str, Any]]:  # Any: a content part, well formed or not.
    return [{"role": "user", "content": [part]}]


def decoded_part(part: dict[str, Any]) -> Image.Image:  # Any: JSON.
    header, payload = part["image_url"]["url"].split(",", 1)
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def test_a_big_photo_with_default_settings_is_shrunk_to_a_bounded_part(photo_8000x6000: bytes) -> None:
    """8000x6000 used to become a ~65 MB PNG data URL that split_image_parts refused outside a row handler."""
    part = content_part_for(photo_8000x6000)

    url = part["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")  # a photo stays a JPEG
    image = decoded_part(part)
    assert image.width * image.height <= images.DEFAULT_MAX_OUTPUT_PIXELS
    assert abs(image.width / image.height - 8000 / 6000) < 0.01
    assert len(url) * 3 // 4 <= images.DEFAULT_MAX_OUTPUT_BYTES
    _, found = split_image_parts([{"role": "user", "content": [part]}])
    assert [decoded.size for decoded in found] == [image.size]


def test_an_explicit_max_side_is_kept_and_an_encoding_over_the_byte_bound_fails_the_row(
    photo_8000x6000: bytes,
) -> None:
    with pytest.raises(ValueError, match=r"^image too large: 8000x6000 pixels encode to \d+ bytes"):
        content_part_for(photo_8000x6000, ImageOptions(max_side=8000, max_output_bytes=1 << 20))


def test_a_png_too_big_as_png_falls_back_to_jpeg() -> None:
    noise = Image.merge("RGB", [Image.effect_noise((300, 300), 80) for _ in range(3)])

    part = content_part_for(encode(noise), ImageOptions(max_output_bytes=200_000))

    assert part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert decoded_part(part).size == (300, 300)


def test_formats_chosen_for_the_engine() -> None:
    """auto: a JPEG stays a JPEG (lossy already); anything else is PNG (lossless: text stays crisp)."""
    assert content_part_for(RGB_JPEG)["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert content_part_for(RGB_PNG)["image_url"]["url"].startswith("data:image/png;base64,")
    png = ImageOptions(encode_format="PNG")
    assert content_part_for(RGB_JPEG, png)["image_url"]["url"].startswith("data:image/png;base64,")
    jpeg = ImageOptions(encode_format="JPEG")
    assert content_part_for(RGB_PNG, jpeg)["image_url"]["url"].startswith("data:image/jpeg;base64,")


@pytest.mark.parametrize(
    ("source", "options", "size"),
    [
        ((4000, 2000), {"max_output_pixels": 2_000_000}, (2000, 1000)),
        ((3000, 3000), {"max_output_pixels": 1_000_000}, (1000, 1000)),
        ((100, 100), {"max_output_pixels": 10_000}, (100, 100)),
        ((4000, 2000), {"max_output_pixels": 1_000, "max_side": 3000}, (3000, 1500)),
        ((4000, 2000), {"max_output_pixels": 1_000, "size": (64, 64)}, (64, 64)),
    ],
    ids=["wide", "square", "at-the-bound", "max-side-wins", "size-wins"],
)
def test_the_default_pixel_bound_applies_when_no_size_is_asked(
    source: tuple[int, int], options: dict[str, Any], size: tuple[int, int]
) -> None:
    image = load_image(encode(Image.new("RGB", source, "white")), ImageOptions(**options))

    assert image.size == size


@pytest.mark.parametrize(
    "options",
    [
        {"max_output_pixels": 0},
        {"max_output_pixels": images.PART_MAX_PIXELS + 1},
        {"max_output_bytes": images.PART_MAX_BYTES + 1},
        {"size": (10_000, 10_000)},
        {"jpeg_quality": 0},
    ],
)
def test_options_that_could_make_a_part_split_refuses_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        ImageOptions(**options)


def test_image_content_part_refuses_what_split_would_refuse() -> None:
    with pytest.raises(ValueError, match="^image too large: "):
        image_content_part(Image.new("RGB", (64, 64)), ImageOptions(max_output_bytes=10))


@pytest.mark.parametrize(
    ("messages", "kind"),
    [
        ("not a list", "bad messages"),
        ([42], "bad messages"),
        (one_part({"type": "image_url", "image_url": "http://x/a.png"}), BAD_VALUE_KIND),
        (one_part({"type": "image_url", "image_url": {"url": 42}}), BAD_VALUE_KIND),
        (one_part({"type": "image_url", "image_url": None}), BAD_VALUE_KIND),
        (one_part({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}), BAD_VALUE_KIND),
        (one_part({"type": "image_url", "image_url": {"url": "data:,x"}}), BAD_VALUE_KIND),
        (one_part({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}), BAD_IMAGE_KIND),
        (one_part({"type": "image", "image": "a.png"}), BAD_VALUE_KIND),
        (one_part({"type": "image"}), BAD_VALUE_KIND),
    ],
    ids=[
        "not-a-list",
        "not-a-message",
        "url-string",
        "url-not-text",
        "no-url",
        "bad-base64",
        "not-base64",
        "not-an-image",
        "image-not-prepared",
        "bare-placeholder",
    ],
)
def test_split_image_parts_raises_only_reasons(messages: Any, kind: str) -> None:  # Any: JSON.
    with pytest.raises(ValueError) as caught:
        split_image_parts(messages)

    assert reason_kind(str(caught.value)) == kind
    assert "message 0" in str(caught.value) or kind == "bad messages"


def test_split_image_parts_refuses_a_data_url_over_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "PART_MAX_BYTES", 100)
    url = "data:image/png;base64," + base64.b64encode(bytes(200)).decode()

    with pytest.raises(ValueError, match="^image too large: message 0 part 0: "):
        split_image_parts([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])


# -- imports -------------------------------------------------------------------------------------


def test_importing_the_module_loads_no_pillow_or_pyarrow() -> None:
    code = (
        "import sys, airflow_provider_raybatch.pipeline.read.images\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PIL', 'pyarrow', 'ray')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


def test_kinds_are_distinct_and_have_no_colon() -> None:
    kinds = [
        images.MISSING_KIND,
        images.BAD_VALUE_KIND,
        images.FETCH_KIND,
        images.TOO_LARGE_KIND,
        images.TOO_SMALL_KIND,
        images.BAD_IMAGE_KIND,
        images.NOT_ALLOWED_KIND,
    ]

    assert len(set(kinds)) == len(kinds)
    assert all(":" not in kind for kind in kinds)


# -- what error rows show instead of the image ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, None),
        (b"\x89PNG" + bytes(5000), "<5004 bytes>"),
        ("data:application/octet-stream;base64," + base64.b64encode(bytes(7)).decode(), "<7 bytes>"),
        ("data:application/octet-stream;base64,", "<0 bytes>"),
        ("data:image/png;base64," + base64.b64encode(bytes(10)).decode(), "<image/png data URL, 10 bytes>"),
        ("photos/a.png", "photos/a.png"),
        ("s3://bucket/" + "k" * 300, "s3://bucket/" + "k" * 185 + "..."),
        ({"bytes": bytes(12), "path": "a.png"}, {"bytes": "<12 bytes>", "path": "a.png"}),
        ({"bytes": None, "path": "missing.png"}, {"bytes": None, "path": "missing.png"}),
        (42, "42"),
    ],
    ids=[
        "none",
        "bytes",
        "carried-bytes",
        "empty",
        "data-url",
        "path",
        "long-uri",
        "struct",
        "path-struct",
        "int",
    ],
)
def test_describe_image_value_is_short(value: Any, shown: Any) -> None:  # Any: a cell and its stand-in.
    assert images.describe_image_value(value) == shown
    assert len(json.dumps(shown)) <= 220


# -- images inside the messages a preprocess returns ----------------------------------------------


def user_message(*parts: Any) -> dict[str, Any]:  # Any: content parts.
    return {"role": "user", "content": [*parts, {"type": "text", "text": "Describe it."}]}


@pytest.fixture()
def image_forms(
    tmp_path: Path, http_base: str
) -> dict[str, Any]:  # Any: the image values Ray Data LLM takes.
    (tmp_path / "a.png").write_bytes(RGB_PNG)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "b.png").write_bytes(RGB_PNG)
    data_url = "data:image/png;base64," + base64.b64encode(RGB_PNG).decode()
    return {
        "pil": Image.new("RGB", (40, 30), (200, 10, 10)),
        "pil-rgba": Image.new("RGBA", (40, 30), (0, 0, 0, 0)),
        "bytes": RGB_PNG,
        "data-url": data_url,
        "path": str(tmp_path / "a.png"),
        "relative-path": "photos/b.png",
        "file-url": f"file://{tmp_path}/a.png",
        "http-url": f"{http_base}/ok.png",
        "hf-struct": {"bytes": RGB_PNG, "path": "x.png"},
    }


@pytest.mark.parametrize(
    "form",
    ["pil", "pil-rgba", "bytes", "data-url", "path", "relative-path", "file-url", "http-url", "hf-struct"],
)
def test_each_image_form_of_a_message_becomes_the_canonical_part(
    image_forms: dict[str, Any], tmp_path: Path, form: str
) -> None:  # Any: image values.
    messages = [
        {"role": "system", "content": "Caption."},
        user_message({"type": "image", "image": image_forms[form]}),
    ]

    prepared = images.normalize_message_images(messages, OPEN_OPTIONS, relative_to=str(tmp_path))

    assert json.loads(json.dumps(prepared)) == prepared  # JSON text, as the pipeline carries it
    assert prepared[0] == messages[0]
    part, text = prepared[1]["content"]
    assert text == {"type": "text", "text": "Describe it."}
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    rendered, found = split_image_parts(prepared)
    assert [image.size for image in found] == [(40, 30)]
    assert rendered[1]["content"][0] == {"type": "image"}


@pytest.mark.parametrize("form", ["data-url", "path", "file-url", "http-url"])
def test_image_url_parts_are_read_the_same_way(image_forms: dict[str, Any], form: str) -> None:
    url = image_forms[form]
    for part in (
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        {"type": "image_url", "image_url": url},
    ):
        (prepared,) = images.normalize_message_images([user_message(part)], OPEN_OPTIONS)

        assert decoded_part(prepared["content"][0]).size == (40, 30)


def test_messages_without_images_pass_through_unchanged_and_the_input_is_left_as_it_was() -> None:
    part = {"type": "image", "image": RGB_PNG}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": None, "tool_calls": []},
        user_message(part),
    ]
    before = json.loads(json.dumps(images.describe_message_images(messages)))

    prepared = images.normalize_message_images(messages)

    assert prepared[:2] == messages[:2]
    assert messages[2]["content"][0] is part and part["image"] is RGB_PNG
    assert images.describe_message_images(messages) == before


def test_a_big_pil_image_is_bounded_like_any_other() -> None:
    big = Image.new("RGB", (4000, 3000), "white")

    (prepared,) = images.normalize_message_images([user_message({"type": "image", "image": big})])

    image = decoded_part(prepared["content"][0])
    assert image.width * image.height <= images.DEFAULT_MAX_OUTPUT_PIXELS


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ("hello", "bad messages: messages must be a list of chat messages, got a str"),
        ([42], "bad messages: message 0 is a int, not an object"),
        ([{"role": "user", "content": 42}], "bad messages: message 0: content must be text or a list of"),
        ([{"role": "user", "content": ["hi"]}], "bad messages: message 0 part 0 is a str, not an object"),
        ([user_message({"type": "audio"})], "bad messages: message 0 part 0: unknown part type 'audio'"),
        ([user_message({"image": "a.png"})], "bad messages: message 0 part 0: unknown part type None"),
        ([user_message({"type": ["image"]})], "bad messages: message 0 part 0: unknown part type ['image']"),
        ([user_message({"type": "image"})], "bad messages: message 0 part 0: an image part needs 'image'"),
        ([user_message({"type": "image", "image": None})], "bad messages: message 0 part 0: an image part"),
        ([user_message({"type": "image_url"})], "bad messages: message 0 part 0: an image_url part needs"),
        ([user_message({"type": "image_url", "image_url": {"uri": "x"}})], "bad messages: message 0 part 0"),
        ([user_message({"type": "image_url", "image_url": 42})], "bad messages: message 0 part 0: an image"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 42}]}],
            "bad messages: message 0 part 0: a text part needs 'text', a string",
        ),
        ([user_message({"type": "image", "image": b"junk"})], "bad image: message 0 part 0: cannot identify"),
        (
            [user_message({"type": "image", "image": "/no/such.png"})],
            "missing image: message 0 part 0: no such file: /no/such.png",
        ),
        ([user_message({"type": "image", "image": 42})], "bad image value: message 0 part 0: cannot read an"),
        (
            [user_message({"type": "image", "image": Image.new("RGB", (2, 2)) if Image else None})],
            "image too small: message 0 part 0: 2x2 pixels",
        ),
        (
            [user_message({"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a b.png"}})],
            "image fetch failed: message 0 part 0: http://127.0.0.1:9/a b.png: ",
        ),
    ],
    ids=[
        "not-a-list",
        "not-a-message",
        "content-int",
        "part-str",
        "unknown-type",
        "no-type",
        "type-list",
        "no-image",
        "image-none",
        "no-image-url",
        "image-url-no-url",
        "image-url-int",
        "text-not-text",
        "corrupt",
        "missing-file",
        "image-int",
        "too-small",
        "unfetchable",
    ],
)
def test_a_malformed_message_or_image_is_the_rows_reason(messages: Any, reason: str) -> None:  # Any: JSON.
    with pytest.raises(ValueError) as caught:
        images.normalize_message_images(messages, OPEN_OPTIONS)

    assert str(caught.value).startswith(reason)


def test_too_many_images_in_one_row_are_refused_before_any_is_read() -> None:
    parts = [{"type": "image", "image": "/no/such.png"}] * 5

    with pytest.raises(ValueError, match=r"^bad messages: message 0 part 4: more than max_images=4 images"):
        images.normalize_message_images([user_message(*parts)], max_images=4)


def test_describe_message_images_carries_no_image_bytes(image_forms: dict[str, Any], tmp_path: Path) -> None:
    parts = [{"type": "image", "image": value} for value in image_forms.values()]
    parts.append({"type": "image_url", "image_url": {"url": image_forms["data-url"]}})
    parts.append({"type": "image_url", "image_url": image_forms["data-url"]})
    messages = [{"role": "system", "content": "Caption."}, user_message(*parts)]
    prepared = images.normalize_message_images(messages[1:], OPEN_OPTIONS, relative_to=str(tmp_path))
    messages.append({"role": "user", "content": prepared[0]["content"]})

    described = images.describe_message_images(messages)

    text = json.dumps(described)
    assert base64.b64encode(RGB_PNG).decode()[:40] not in text and len(text) < 4000
    content = described[1]["content"]
    assert content[0]["image"] == "<40x30 RGB image>" and content[2]["image"] == f"<{len(RGB_PNG)} bytes>"
    assert content[3]["image"] == f"<image/png data URL, {len(RGB_PNG)} bytes>"
    assert content[4]["image"] == image_forms["path"]  # where the image is, not what
    assert content[-3]["image_url"] == {"url": f"<image/png data URL, {len(RGB_PNG)} bytes>"}
    assert content[-1] == {"type": "text", "text": "Describe it."}
    assert described[0] == messages[0]
    assert described[2]["content"][0]["image_url"]["url"].startswith("<image/")


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "text",
        42,
        [42, None],
        [{"role": "user", "content": [b"raw", 42, None]}],
        [{"content": b"raw"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": b"raw"}]}],
        [{"name": bytearray(3)}],
    ],
)
def test_describe_message_images_takes_anything_and_returns_json(messages: Any) -> None:  # Any: JSON-ish.
    described = images.describe_message_images(messages)

    json.dumps(described)
    assert "raw" not in json.dumps(described)


def test_describe_image_value_of_a_pil_image() -> None:
    assert images.describe_image_value(Image.new("L", (3, 2))) == "<3x2 L image>"


# -- properties: what content_part_for makes, split_image_parts takes; nothing else escapes ---------


def _needs_hypothesis() -> None:
    if given is None:
        pytest.fail(
            "hypothesis is not importable here: add 'hypothesis>=6' to the [test] extra in pyproject.toml."
        )


KINDS = {
    MISSING_KIND,
    BAD_VALUE_KIND,
    FETCH_KIND,
    TOO_LARGE_KIND,
    TOO_SMALL_KIND,
    BAD_IMAGE_KIND,
    NOT_ALLOWED_KIND,
    "bad messages",
}


def assert_a_reason(err: BaseException) -> None:
    assert isinstance(err, ValueError), repr(err)
    kind, sep, detail = str(err).partition(": ")
    assert kind in KINDS and sep and detail, str(err)


def test_every_part_content_part_for_makes_is_one_split_image_parts_takes() -> None:
    _needs_hypothesis()
    sizes = st.tuples(st.integers(1, 300), st.integers(1, 300))
    options = st.builds(
        ImageOptions,
        size=st.none() | sizes,
        min_side=st.just(1),
        encode_format=st.sampled_from(["auto", "PNG", "JPEG"]),
        jpeg_quality=st.integers(1, 100),
        max_output_pixels=st.integers(1, 100_000),
        max_output_bytes=st.integers(1_000, 200_000),
    )

    @settings(max_examples=150, deadline=None, database=None)
    @given(
        size=sizes,
        mode=st.sampled_from(["RGB", "RGBA", "L", "P", "I;16", "1", "CMYK"]),
        stored=st.sampled_from(["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "pil"]),
        noise=st.booleans(),
        options=options,
    )
    def check(size: tuple[int, int], mode: str, stored: str, noise: bool, options: ImageOptions) -> None:
        image = Image.effect_noise(size, 90).convert(mode) if noise else Image.new(mode, size)
        try:
            value = image if stored == "pil" else encode(image, stored)
        except (OSError, ValueError):  # a mode the format cannot hold (CMYK as PNG or GIF, RGBA as JPEG)
            value = encode(image.convert("RGB"), stored)
        try:
            part = content_part_for(value, options)
        except ValueError as err:  # e.g. too large for a tiny max_output_bytes: the row's reason
            assert_a_reason(err)
            event(f"refused: {reason_kind(str(err))}")
            return
        event("made a part")
        assert json.loads(json.dumps(part)) == part
        _, found = split_image_parts([{"role": "user", "content": [part]}])
        assert found[0].size == decoded_part(part).size

    check()


def json_like(text: Any = None) -> Any:  # Any: hypothesis strategies.
    """Any JSON value, and bytes; text without '://' (no s3:// or http:// reaches the network here)."""
    text = text or st.text(max_size=30).filter(lambda t: "://" not in t)
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | text | st.binary(max_size=20)
    return st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(text, c, max_size=4))


def messages_like() -> Any:  # Any: a hypothesis strategy.
    kinds = st.sampled_from(["text", "image", "image_url"]) | json_like()
    part = st.fixed_dictionaries(
        {}, optional={"type": kinds, "text": json_like(), "image": json_like(), "image_url": json_like()}
    )
    content = st.lists(part | json_like(), max_size=4) | json_like()
    message = st.fixed_dictionaries({"role": st.just("user")}, optional={"content": content})
    return st.lists(message | json_like(), max_size=3) | json_like()


def test_split_image_parts_raises_nothing_but_reasons() -> None:
    _needs_hypothesis()

    @settings(max_examples=300, deadline=None, database=None)
    @given(messages=messages_like())
    def check(messages: Any) -> None:  # Any: JSON.
        try:
            split_image_parts(messages)
            event("split")
        except ValueError as err:
            assert_a_reason(err)
            event(f"refused: {reason_kind(str(err))}")

    check()


def test_normalize_and_describe_message_images_raise_nothing_but_reasons(tmp_path: Path) -> None:
    _needs_hypothesis()

    @settings(max_examples=300, deadline=None, database=None)
    @given(messages=messages_like())
    def check(messages: Any) -> None:  # Any: JSON.
        json.dumps(images.describe_message_images(messages))
        try:
            prepared = images.normalize_message_images(
                messages, ImageOptions(timeout_seconds=1), str(tmp_path)
            )
        except ValueError as err:
            assert_a_reason(err)
            event(f"refused: {reason_kind(str(err))}")
            return
        event("normalized")
        split_image_parts(prepared)

    check()
