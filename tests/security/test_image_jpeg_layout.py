"""A JPEG's scans and marker segments are counted before Pillow opens it.

Row data is untrusted (docs/security.md). Pillow bounds no scan count, and libjpeg folds every scan of
a progressive JPEG into the whole image's coefficients: the last scan of a 4096x4096 JPEG repeated
10,000 times before its end marker (0.41 MiB) took 112 s of CPU to read. Before the first scan, Pillow
reads markers in Python, keeping every APP segment in a list and stepping over 0xFF fill a byte at a
time. pipeline/read/jpeg_layout.py walks the segments first and refuses more than MAX_JPEG_SCANS
scans, MAX_JPEG_MARKERS markers or MAX_JPEG_STRAY_BYTES stray bytes as the row's ``bad image``.

Measured on a shared 2-core machine, before the walk -> after: 10,000 scans of a 4096x4096 image
112 s of CPU -> 0.0 s; 1,000 scans of a 2048x2048 image (40 KB) 2.7 s -> 0.0 s; 31 MiB of empty
APP1 segments 37 s and +2.1 GiB -> 0.001 s and +0 MiB; 8 MiB of 0xFF fill 10.4 s -> 0.06 s. The
hostile files are made here from a JPEG Pillow wrote (a scan repeated, segments or bytes inserted);
CPU and growth are measured in a fresh interpreter.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read.images import load_image  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.jpeg_layout import (  # noqa: E402
    MAX_JPEG_MARKERS,
    MAX_JPEG_SCANS,
    MAX_JPEG_STRAY_BYTES,
    jpeg_layout_problem,
)
from tests.security.image_measure import REFUSED_CPU_SECONDS, SLACK_MIB, measure  # noqa: E402


def jpeg(size: tuple[int, int] = (64, 64), **save: Any) -> bytes:  # Any: Pillow's save options.
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize(size).convert("RGB").save(buffer, format="JPEG", **save)
    return buffer.getvalue()


def repeated_last_scan(data: bytes, times: int) -> bytes:
    """``data`` with its last scan (SOS header and entropy-coded data) repeated ``times`` more times."""
    start, end = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    return data[:end] + data[start:end] * times + data[end:]


def after_first_segment(data: bytes, inserted: bytes) -> bytes:
    """``data`` with ``inserted`` after its first segment (APP0), where Pillow reads in Python."""
    end = 4 + int.from_bytes(data[4:6], "big")
    return data[:end] + inserted + data[end:]


def test_a_thousand_repeated_scans_are_refused_before_libjpeg_decodes_them(tmp_path: Path) -> None:
    path = tmp_path / "scans.jpg"
    path.write_bytes(repeated_last_scan(jpeg((2048, 2048), progressive=True), 1000))
    result = measure(path, "JpegImagePlugin")
    assert result.get("reason") == (
        f"bad image: JPEG has {MAX_JPEG_SCANS + 1} scans (SOS markers) or more, "
        f"over the bound of {MAX_JPEG_SCANS}"
    ), result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result


def test_a_flood_of_empty_app_segments_is_refused_before_pillow_lists_them(tmp_path: Path) -> None:
    path = tmp_path / "app.jpg"
    path.write_bytes(after_first_segment(jpeg(), b"\xff\xe1\x00\x02" * (1 << 20)))  # 4 MiB
    result = measure(path, "JpegImagePlugin")
    assert result.get("reason") == (
        f"bad image: JPEG has {MAX_JPEG_MARKERS + 1} markers or more, over the bound of {MAX_JPEG_MARKERS}"
    ), result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result
    assert result["grown_mib"] < SLACK_MIB, result


@pytest.mark.parametrize("stray", [b"\xff", b"\x01", b"\xff\x00"], ids=["fill", "junk", "stuffed"])
def test_stray_bytes_between_segments_are_refused(tmp_path: Path, stray: bytes) -> None:
    path = tmp_path / "stray.jpg"
    nbytes = 1 << 20
    path.write_bytes(after_first_segment(jpeg(), stray * (nbytes // len(stray))))
    result = measure(path, "JpegImagePlugin")
    assert result.get("reason", "").startswith(f"bad image: JPEG has {nbytes} stray bytes"), result
    assert result["reason"].endswith(f"over the bound of {MAX_JPEG_STRAY_BYTES}"), result
    assert result["cpu_seconds"] < REFUSED_CPU_SECONDS, result


def test_a_flood_of_markers_without_a_segment_stops_the_walk_at_the_bound() -> None:
    data = jpeg(progressive=True)
    end = data.rfind(b"\xff\xd9")
    flood = data[:end] + b"\xff\x01" * (4 << 20) + data[end:]  # 8 MiB of TEM markers between scans
    started = time.process_time()
    assert jpeg_layout_problem(flood) == (
        f"JPEG has {MAX_JPEG_MARKERS + 1} markers or more, over the bound of {MAX_JPEG_MARKERS}"
    )
    assert time.process_time() - started < REFUSED_CPU_SECONDS


def test_scans_up_to_the_bound_still_read() -> None:
    data = jpeg(progressive=True)
    scans = data.count(b"\xff\xda")
    assert jpeg_layout_problem(repeated_last_scan(data, MAX_JPEG_SCANS - scans)) is None
    assert load_image(repeated_last_scan(data, MAX_JPEG_SCANS - scans)).size == (64, 64)
    assert jpeg_layout_problem(repeated_last_scan(data, MAX_JPEG_SCANS - scans + 1)) is not None


def test_a_few_fill_bytes_before_a_marker_still_read() -> None:
    data = after_first_segment(jpeg(), b"\xff" * 16)
    assert jpeg_layout_problem(data) is None
    assert load_image(data).size == (64, 64)


def test_scans_after_the_end_marker_are_not_counted() -> None:
    data = jpeg(progressive=True)
    end = data.rfind(b"\xff\xd9")
    assert jpeg_layout_problem(data + data[data.rfind(b"\xff\xda") : end] * (MAX_JPEG_SCANS + 1)) is None


def test_bytes_that_are_not_a_jpeg_or_are_cut_short_are_left_to_pillow() -> None:
    data = repeated_last_scan(jpeg(progressive=True), 1000)
    assert jpeg_layout_problem(b"\x89PNG\r\n\x1a\n") is None
    assert jpeg_layout_problem(data[:3]) is None
    assert jpeg_layout_problem(data[:200]) is None
    assert jpeg_layout_problem(b"\xff\xd8\xff\xe0\x00\x01") is None  # a length under its own 2 bytes


def _with_exif_and_icc() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the reader applies it
    exif[0x010F] = "camera"
    icc = bytes(200_000)  # over one APP2 segment's 64 KiB: Pillow splits it into four
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize((96, 64)).convert("RGB").save(
        buffer, format="JPEG", exif=exif.tobytes(), icc_profile=icc, progressive=True
    )
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (jpeg((640, 480)), (640, 480)),
        (jpeg((640, 480), progressive=True), (640, 480)),
        (jpeg((640, 480), progressive=True, optimize=True, subsampling=0), (640, 480)),
        (jpeg((640, 480), restart_marker_blocks=1), (640, 480)),
        (_with_exif_and_icc(), (64, 96)),
    ],
    ids=["baseline", "progressive", "progressive-optimized", "restart-markers", "exif-and-split-icc"],
)
def test_ordinary_jpegs_still_read(data: bytes, size: tuple[int, int]) -> None:
    assert jpeg_layout_problem(data) is None
    assert load_image(data).size == size
