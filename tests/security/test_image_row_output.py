"""What one row's images encode to for the engine is bounded all together, not only image by image.

Row data is untrusted (docs/security.md). A chat row whose 16 image parts (``max_images``) all named
one 12.6 MB PNG of noise passed every per-image bound, and ``normalize_message_images`` made a
256 MiB prompt that ``json.dumps`` copied again: +755 MiB in 12 s. Now the row's encodings are added
up as each image is made, and the row fails ``image too large`` naming the total and
``max_row_output_bytes`` before the next image is read.

The growth is measured in a fresh interpreter (``ru_maxrss`` is a high-water mark).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read import images  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.images import (  # noqa: E402
    DEFAULT_MAX_IMAGES,
    DEFAULT_MAX_ROW_OUTPUT_BYTES,
    ImageOptions,
    normalize_message_images,
)

_MEASURE = """
import json, resource, sys
from PIL import Image, PngImagePlugin  # not the row's cost
from airflow_provider_raybatch.pipeline.read.images import normalize_message_images

messages = json.loads(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    prepared = normalize_message_images(messages, relative_to=sys.argv[1])
    result = {"prompt_chars": len(json.dumps(prepared, ensure_ascii=False))}
except ValueError as err:
    result = {"reason": str(err)}
result["grown_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(result))
"""


def measure(folder: Path, messages: list[dict[str, Any]]) -> dict[str, Any]:  # Any: JSON.
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(folder), json.dumps(messages)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def chat(*parts: dict[str, Any]) -> list[dict[str, Any]]:  # Any: a content part's JSON.
    return [{"role": "user", "content": [{"type": "text", "text": "Describe these."}, *parts]}]


def noise_png(side: int) -> bytes:
    """A PNG of random pixels: it compresses to nothing, so its encoding is as big as its pixels."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_sixteen_parts_naming_one_big_png_are_refused_as_the_images_are_read(tmp_path: Path) -> None:
    (tmp_path / "noise.png").write_bytes(noise_png(2048))  # 12.6 MB, 4 Mi pixels: not shrunk
    part = {"type": "image_url", "image_url": {"url": "noise.png"}}
    result = measure(tmp_path, chat(*[part] * DEFAULT_MAX_IMAGES))
    reason = result.get("reason", "")
    assert reason.startswith("image too large: message 0 part 3: the row's images encode to "), result
    assert f"over max_row_output_bytes={DEFAULT_MAX_ROW_OUTPUT_BYTES}" in reason, result
    # Three images' data URLs and one decode, not sixteen of each (+755 MiB without the bound).
    assert result["grown_mib"] < 160, result


def test_no_image_is_read_after_the_row_is_over_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    data = noise_png(64)
    options = ImageOptions(max_output_bytes=len(data) + 1024, max_row_output_bytes=2 * len(data) + 1024)
    made: list[object] = []
    real = images.read_image_bytes

    def counted(*args: Any, **kwargs: Any) -> bytes:  # Any: read_image_bytes' own arguments.
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(images, "read_image_bytes", counted)
    parts = [{"type": "image", "image": data}] * 6
    with pytest.raises(
        ValueError, match=r"^image too large: message 0 part 3: the row's images encode to \d+ bytes"
    ):
        normalize_message_images(chat(*parts), options)
    assert len(made) == 3


def test_a_row_under_the_bound_keeps_every_image() -> None:
    data = noise_png(64)
    prepared = normalize_message_images(chat(*[{"type": "image", "image": data}] * DEFAULT_MAX_IMAGES))
    urls = [part["image_url"]["url"] for part in prepared[0]["content"][1:]]
    assert len(urls) == DEFAULT_MAX_IMAGES
    assert all(url.startswith("data:image/png;base64,") for url in urls)


def test_a_row_bound_under_one_image_is_refused_when_the_options_are_built() -> None:
    with pytest.raises(TypeError, match="max_row_output_bytes=1000 is invalid: a row must hold one image"):
        ImageOptions(max_output_bytes=2000, max_row_output_bytes=1000)
