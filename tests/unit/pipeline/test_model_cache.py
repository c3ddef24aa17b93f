"""Tests of airflow_provider_raybatch/pipeline/generate/model_cache.py: the source's key and what makes
a copy current.

The checks of the cache's folders are tests/unit/pipeline/test_private_folders.py; the fetch over a real
S3 server, planted folders included, is tests/security/test_model_cache.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import model_cache
from airflow_provider_raybatch.pipeline.generate.model_cache import (
    ModelObject,
    copy_matches,
    objects_digest,
    source_key,
    write_marker,
)
from airflow_provider_raybatch.pipeline.storage import S3Options

URI = "s3://models/llama-3-8b"
OBJECTS = [ModelObject("config.json", 2, '"e1"'), ModelObject("tokenizer/t.json", 3, '"e2"')]


@pytest.fixture(autouse=True)
def _no_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)


# -- source_key ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "same",
    [
        S3Options(endpoint_url="http://minio:9000/", region="eu-west-1"),
        S3Options(endpoint_url="HTTP://MINIO:9000", region="eu-west-1"),
        S3Options(endpoint_url="http://minio:9000", region="eu-west-1", access_key="AKIA", secret_key="s"),
    ],
)
def test_the_source_key_is_the_endpoint_region_and_uri_alone(same: S3Options) -> None:
    """Spellings of one endpoint, and other credentials for it, name one source."""
    assert source_key(URI, same) == source_key(URI, S3Options("http://minio:9000", "eu-west-1"))
    assert source_key(f"{URI}/", same) == source_key(URI, same)


@pytest.mark.parametrize(
    "other",
    [
        S3Options(endpoint_url="http://minio-prod:9000", region="eu-west-1"),
        S3Options(endpoint_url="https://minio:9000", region="eu-west-1"),
        S3Options(endpoint_url="http://minio:9000", region="us-east-1"),
        S3Options(region="eu-west-1"),  # AWS itself
    ],
)
def test_another_endpoint_or_region_is_another_source(other: S3Options) -> None:
    assert source_key(URI, other) != source_key(URI, S3Options("http://minio:9000", "eu-west-1"))


def test_an_endpoint_from_the_nodes_environment_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    aws = source_key(URI, S3Options())
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")

    assert source_key(URI, S3Options()) != aws
    assert source_key(URI, S3Options()) == source_key(URI, S3Options(endpoint_url="http://minio:9000"))


def test_the_source_key_holds_no_credential() -> None:
    key = source_key(URI, S3Options("http://minio:9000", "eu-west-1", "AKIAEXAMPLE", "secret/value"))

    assert len(key) == 64 and "AKIAEXAMPLE" not in key and "secret" not in key


# -- objects_digest, the marker, copy_matches ----------------------------------------------------


def test_the_digest_changes_with_any_key_size_or_etag() -> None:
    changed = [
        [ModelObject("config.json", 2, '"e9"'), OBJECTS[1]],
        [ModelObject("config.json", 4, '"e1"'), OBJECTS[1]],
        [ModelObject("other.json", 2, '"e1"'), OBJECTS[1]],
        OBJECTS[:1],
    ]

    assert len({objects_digest(OBJECTS), *(objects_digest(objects) for objects in changed)}) == 5
    assert objects_digest(list(OBJECTS)) == objects_digest(OBJECTS)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A complete copy of OBJECTS, marker included."""
    folder = tmp_path / "copy"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_bytes(b"{}")
    (folder / "tokenizer" / "t.json").write_bytes(b"abc")
    write_marker(str(folder), URI, OBJECTS)
    return folder


def test_a_complete_copy_matches(copy: Path) -> None:
    marker = json.loads((copy / model_cache.COMPLETE_MARKER).read_text())

    assert copy_matches(str(copy), OBJECTS)
    assert marker == {
        "source": URI,
        "objects": [
            {"key": "config.json", "size": 2, "etag": '"e1"'},
            {"key": "tokenizer/t.json", "size": 3, "etag": '"e2"'},
        ],
    }
    assert oct((copy / model_cache.COMPLETE_MARKER).stat().st_mode & 0o777) == oct(0o600)


def test_a_copy_of_other_objects_does_not_match(copy: Path) -> None:
    assert not copy_matches(str(copy), [ModelObject("config.json", 2, '"e9"'), OBJECTS[1]])
    assert not copy_matches(str(copy), OBJECTS[:1])


@pytest.mark.parametrize(
    "damage",
    [
        lambda copy: (copy / "config.json").write_bytes(b"{ }"),  # another size
        lambda copy: (copy / "config.json").unlink(),
        lambda copy: ((copy / "config.json").unlink(), (copy / "config.json").symlink_to(copy / "x")),
        lambda copy: (copy / model_cache.COMPLETE_MARKER).write_bytes(b"not json"),
        lambda copy: (copy / model_cache.COMPLETE_MARKER).write_bytes(b"[]"),
        lambda copy: (copy / model_cache.COMPLETE_MARKER).unlink(),
    ],
    ids=["size", "missing file", "link", "marker not json", "marker not an object", "no marker"],
)
def test_a_damaged_copy_does_not_match(copy: Path, damage) -> None:
    (copy / "x").write_bytes(b"{}")
    damage(copy)

    assert not copy_matches(str(copy), OBJECTS)


def test_the_marker_is_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the Ray user's file")
    (tmp_path / model_cache.COMPLETE_MARKER).symlink_to(victim)

    with pytest.raises(FileExistsError):
        write_marker(str(tmp_path), URI, OBJECTS)

    assert victim.read_text() == "the Ray user's file"
