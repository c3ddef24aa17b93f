"""Tests of airflow_provider_raybatch/pipeline/images.py: a row's image for the engine, or why not.

The corrupt-image corpus is made here, in memory and under tmp_path; URLs are served by a local
HTTP server on 127.0.0.1 (no network). Needs Pillow (it comes with vLLM on the cluster side).
"""

from __future__ import annotations

import base64
import http.server
import io
import json
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

from airflow_provider_raybatch.pipeline import images, storage
from airflow_provider_raybatch.pipeline.commit import reason_kind
from airflow_provider_raybatch.pipeline.images import (
    BAD_IMAGE_KIND,
    BAD_VALUE_KIND,
    FETCH_KIND,
    MISSING_KIND,
    TOO_LARGE_KIND,
    TOO_SMALL_KIND,
    ImageOptions,
    content_part_for,
    image_content_part,
    load_image,
    read_image_bytes,
    split_image_parts,
)


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
        load_image(value, ImageOptions(**options))
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

    assert load_image({"bytes": None, "path": str(tmp_path / "a.png")}).size == (40, 30)


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

    assert load_image(str(tmp_path / "a.jpg")).size == (64, 48)
    assert load_image(tmp_path / "a.jpg").size == (64, 48)


def test_relative_path_resolves_against_relative_to(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(RGB_PNG)

    assert load_image("imgs/a.png", relative_to=str(tmp_path)).size == (40, 30)
    assert load_image({"bytes": None, "path": "imgs/a.png"}, relative_to=str(tmp_path)).size == (40, 30)
    assert load_image("imgs/a.png", relative_to=f"file://{tmp_path}").size == (40, 30)


def test_file_uri_reads_through_pyarrow(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(RGB_PNG)

    assert load_image(f"file://{tmp_path}/a.png").size == (40, 30)
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

    assert load_image("s3://bucket/a.png").size == (40, 30)
    assert kind_of("s3://bucket/missing.png") == MISSING_KIND
    assert kind_of("s3://bucket") == BAD_VALUE_KIND
    assert kind_of("s3://bucket/a.png", max_bytes=10) == TOO_LARGE_KIND
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
    assert load_image(f"{http_base}/ok.png").size == (40, 30)


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
        load_image(http_base + path, ImageOptions(**options))

    assert reason_kind(str(caught.value)) == kind
    assert detail in str(caught.value)


def test_http_connection_refused() -> None:
    with pytest.raises(ValueError, match=r"^image fetch failed: http://127\.0\.0\.1:9/a\.png: "):
        load_image("http://127.0.0.1:9/a.png", ImageOptions(timeout_seconds=2))


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
        "truncated-png", "truncated-jpeg", "random-bytes", "empty-bytes", "text", "zero-pixels",
        "zero-width", "1x1", "thin-strip", "declared-10g-pixels", "over-default-max-pixels",
        "over-max-pixels", "over-max-bytes", "unaccepted-format", "wrong-dict-shape",
        "dict-bytes-not-bytes", "dict-empty", "dict-empty-path", "dict-missing-path", "missing-path",
        "empty-str", "blank-str", "none", "int", "list", "unsupported-scheme",
    ],
)  # fmt: skip
def test_corrupt_corpus(value: Any, options: dict[str, Any], kind: str) -> None:  # Any: a row's cell.
    value = value() if callable(value) else value  # factories: values built with Pillow

    assert kind_of(value, **options) == kind


def test_reasons_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "folder").mkdir()

    def reason(value: Any, **options: Any) -> str:  # Any: a row's cell; ImageOptions fields.
        with pytest.raises(ValueError) as caught:
            load_image(value, ImageOptions(**options))
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

    assert read_image_bytes(str(tmp_path / "a.png")) == RGB_PNG
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
    ids=["fixed", "fixed-enlarges", "max-side-wide", "max-side-tall", "max-side-never-enlarges",
         "max-side-keeps-one-pixel", "unchanged"],
)  # fmt: skip
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
    assert url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert (decoded.format, decoded.mode, decoded.size) == ("PNG", "RGB", (32, 24))


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

    with pytest.raises(ValueError, match="^bad image value: image part is not a data URL"):
        split_image_parts(messages)


# -- imports -------------------------------------------------------------------------------------


def test_importing_the_module_loads_no_pillow_or_pyarrow() -> None:
    code = (
        "import sys, airflow_provider_raybatch.pipeline.images\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PIL', 'pyarrow', 'ray')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


def test_kinds_are_distinct_and_have_no_colon() -> None:
    kinds = [images.MISSING_KIND, images.BAD_VALUE_KIND, images.FETCH_KIND, images.TOO_LARGE_KIND,
             images.TOO_SMALL_KIND, images.BAD_IMAGE_KIND]  # fmt: skip

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
    ids=["none", "bytes", "carried-bytes", "empty", "data-url", "path", "long-uri", "struct", "path-struct", "int"],
)
def test_describe_image_value_is_short(value: Any, shown: Any) -> None:  # Any: a cell and its stand-in.
    assert images.describe_image_value(value) == shown
    assert len(json.dumps(shown)) <= 220
