"""An image a chat row names more than once is decoded once for that row.

Row data is untrusted (docs/security.md). The bounds on decoding are per image, and a chat row may
hold ``max_images`` (16) image parts: a row naming one 13.5 MB JPEG of 100 progressive scans 16 times
took 31 s of CPU where the image alone takes 1.7 s. ``normalize_message_images`` now keys each image by
a digest of its bytes (a preprocess's PIL image by the object), so another spelling of the same path,
or the same bytes inline, reuses the part already made: a row costs at most what its distinct images
cost. Each part still counts toward ``max_row_output_bytes``, as the prompt holds each.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

Image = pytest.importorskip("PIL.Image")

from airflow_provider_raybatch.pipeline.read import images  # noqa: E402 - after the skip
from airflow_provider_raybatch.pipeline.read.images import DEFAULT_MAX_IMAGES, normalize_message_images  # noqa: E402


def png(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (shade, 0, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


def chat(*parts: dict[str, Any]) -> list[dict[str, Any]]:  # Any: a content part's JSON.
    return [{"role": "user", "content": [{"type": "text", "text": "Describe these."}, *parts]}]


def by_url(url: str) -> dict[str, Any]:  # Any: a content part's JSON.
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bytes each decode of the row was given."""
    seen: list[bytes] = []
    decode = images._decode

    def counted(data: bytes, *args: Any, **kwargs: Any) -> Any:  # Any: _decode's own arguments.
        seen.append(data)
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(images, "_decode", counted)
    return seen


def test_one_image_named_sixteen_ways_is_decoded_once(tmp_path: Path, decodes: list[bytes]) -> None:
    (tmp_path / "pic.png").write_bytes(png(200))
    spellings = [
        by_url("pic.png"),
        by_url("./pic.png"),
        by_url(str(tmp_path / "pic.png")),
        {"type": "image", "image": png(200)},
    ]
    parts = (spellings * DEFAULT_MAX_IMAGES)[:DEFAULT_MAX_IMAGES]
    prepared = normalize_message_images(chat(*parts), relative_to=str(tmp_path))
    content = prepared[0]["content"]
    assert len(decodes) == 1
    assert len(content) == 1 + DEFAULT_MAX_IMAGES
    assert len({part["image_url"]["url"] for part in content[1:]}) == 1
    assert len({id(part["image_url"]) for part in content[1:]}) == DEFAULT_MAX_IMAGES  # each its own


def test_distinct_images_are_each_decoded(tmp_path: Path, decodes: list[bytes]) -> None:
    (tmp_path / "a.png").write_bytes(png(10))
    (tmp_path / "b.png").write_bytes(png(20))
    parts = [by_url("a.png"), by_url("b.png"), by_url("a.png"), by_url("b.png")]
    prepared = normalize_message_images(chat(*parts), relative_to=str(tmp_path))
    urls = [part["image_url"]["url"] for part in prepared[0]["content"][1:]]
    assert len(decodes) == 2
    assert urls[0] == urls[2] != urls[1] == urls[3]


def test_a_repeated_image_counts_toward_the_row_output_bound_each_time(
    tmp_path: Path, decodes: list[bytes]
) -> None:
    (tmp_path / "pic.png").write_bytes(png(200))
    alone = normalize_message_images(chat(by_url("pic.png")), relative_to=str(tmp_path))
    one = images._data_url_bytes(alone[0]["content"][1]["image_url"]["url"])  # what the bound counts
    options = images.ImageOptions(max_output_bytes=one, max_row_output_bytes=3 * one)
    with pytest.raises(ValueError, match="^image too large: message 0 part 4: the row's images encode to "):
        normalize_message_images(chat(*[by_url("pic.png")] * 4), options, relative_to=str(tmp_path))
    assert len(decodes) == 2  # the first call's, and the second call's once
