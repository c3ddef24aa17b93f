"""Tests of airflow_provider_raybatch/pipeline/generate/models.py: where a node keeps a fetched
model, and the fetch.

``fetch_model`` is exercised with a local folder as its source (storage.list_files and
storage.filesystem work on local paths the same way); the paths of ``resolve_model_source`` that
need Ray are left to the integration tests, and the ones here must not import it.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline import credentials, storage
from airflow_provider_raybatch.pipeline.generate import model_cache, models
from airflow_provider_raybatch.pipeline.generate.models import (
    fetch_model,
    local_model_dir,
    resolve_model_source,
)

MODEL_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    "tokenizer/special/added_tokens.json": b"{}",
}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No credentials module and no cached S3 options leak in or out of a test."""
    monkeypatch.setattr(storage, "_s3_options", None)
    monkeypatch.setattr(credentials, "_settings", None)
    yield


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A model folder on local disk, with nested files."""
    folder = tmp_path / "source" / "tiny-llama"
    for name, data in MODEL_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def files_under(folder: Path) -> dict[str, bytes]:
    """The model's files in a copy, without its completion marker."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != model_cache.COMPLETE_MARKER
    }


def marked_keys(folder: Path) -> list[str]:
    """The keys a copy's completion marker records."""
    marker = json.loads((folder / model_cache.COMPLETE_MARKER).read_text())
    return [item["key"] for item in marker["objects"]]


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any ``import ray`` (or a submodule) raises, whether or not Ray is installed here."""
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # type: ignore[arg-type]


def ship_credentials(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process holds S3 settings, as the driver of a job with ``aws_conn_id`` does
    (pipeline/credentials.py: held_for_this_job)."""
    settings = {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}
    monkeypatch.setattr(credentials, "_settings", settings)


# -- local_model_dir ----------------------------------------------------------------------------


def test_local_model_dir_is_stable_for_a_uri() -> None:
    first = local_model_dir("s3://models/llama-3-8b", "/cache")

    assert local_model_dir("s3://models/llama-3-8b", "/cache") == first
    assert local_model_dir("s3://models/llama-3-8b/", "/cache") == first
    assert local_model_dir("s3://models/llama-3-8b//", "/cache") == first


@pytest.mark.parametrize(
    "other",
    [
        "s3://models/llama-3-8b-instruct",
        "s3://other-bucket/llama-3-8b",  # same base name, another source
        "s3://models/v2/llama-3-8b",
    ],
)
def test_local_model_dir_differs_across_uris(other: str) -> None:
    assert local_model_dir(other, "/cache") != local_model_dir("s3://models/llama-3-8b", "/cache")


@pytest.mark.parametrize("cache_dir", ["/tmp/raybatch/models", "/tmp/raybatch/models/"])
def test_local_model_dir_lives_under_the_cache_dir(cache_dir: str) -> None:
    target = local_model_dir("s3://models/llama-3-8b/", cache_dir)

    assert posixpath.dirname(target) == "/tmp/raybatch/models"
    assert posixpath.basename(target).startswith("llama-3-8b-")


def test_local_model_dir_expands_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))

    target = local_model_dir("s3://models/m", "~/models")

    assert posixpath.dirname(target) == f"{tmp_path}/models"


# -- fetch_model --------------------------------------------------------------------------------


def test_fetch_model_copies_every_file_with_its_layout(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "tiny-llama-abc"

    copied = fetch_model(str(source), str(target))

    assert copied == len(MODEL_FILES)
    assert files_under(target) == MODEL_FILES
    assert marked_keys(target) == sorted(MODEL_FILES)


def test_fetch_model_from_a_uri_with_a_trailing_slash(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"

    assert fetch_model(f"{source}/", str(target)) == len(MODEL_FILES)
    assert files_under(target) == MODEL_FILES


def test_fetch_model_writes_the_completion_marker(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"

    fetch_model(str(source), str(target))

    marker = json.loads((target / model_cache.COMPLETE_MARKER).read_text())
    assert marker["source"] == str(source)
    assert [(item["key"], item["size"]) for item in marker["objects"]] == [
        (name, len(MODEL_FILES[name])) for name in sorted(MODEL_FILES)
    ]
    assert all(item["etag"] for item in marker["objects"])


def test_fetch_model_twice_copies_once(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"
    fetch_model(str(source), str(target))

    assert fetch_model(str(source), str(target)) == 0

    assert files_under(target) == MODEL_FILES


def test_fetch_model_of_a_changed_source_copies_again(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "cache" / "m"
    fetch_model(str(source), str(target))
    (source / "config.json").write_bytes(b'{"changed": true}')
    (source / "new-file.bin").write_bytes(b"new")

    assert fetch_model(str(source), str(target)) == len(MODEL_FILES) + 1

    assert files_under(target) == {**MODEL_FILES, "config.json": b'{"changed": true}', "new-file.bin": b"new"}
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]  # the old copy is gone


def test_fetch_model_leaves_no_partial_folder(source: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fetch_model(str(source), str(cache / "m"))
    fetch_model(str(source), str(cache / "m"))

    assert sorted(p.name for p in cache.iterdir()) == ["m"]


def test_fetch_model_of_an_empty_prefix_names_the_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    target = tmp_path / "cache" / "m"

    with pytest.raises(FileNotFoundError) as info:
        fetch_model(str(empty), str(target))

    assert str(empty) in str(info.value)
    assert not target.exists()
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_fetch_model_of_a_missing_prefix_names_the_model(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")

    with pytest.raises(FileNotFoundError, match="no-such-model"):
        fetch_model(missing, str(tmp_path / "cache" / "m"))


@pytest.mark.parametrize(
    "tail", ["a/../../escaped", "../escaped", "/abs/escaped", "a//b", "./config.json", "a/..", "x\0y", ""]
)
def test_fetch_model_refuses_a_listed_key_that_is_not_a_plain_relative_path(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str
) -> None:
    """S3 keys are plain strings (tests/security/test_pipeline_inputs.py has them on a real S3 server);
    here a listing that returns one, next to good files, fails before anything is written."""
    listed = [f"{source}/config.json", f"{source}/{tail}", f"{source}/tokenizer/tokenizer.json"]
    monkeypatch.setattr(storage, "list_files", lambda uri: listed)
    cache = tmp_path / "cache"

    with pytest.raises(ValueError, match="refusing to fetch the model") as caught:
        fetch_model(str(source), str(cache / "m"))

    assert repr(f"{source}/{tail}") in str(caught.value)
    assert not cache.exists()


def test_fetch_model_refuses_a_listed_path_outside_the_prefix(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "list_files", lambda uri: [f"{source}-other/config.json"])

    with pytest.raises(ValueError, match="not a plain relative path"):
        fetch_model(str(source), str(tmp_path / "cache" / "m"))


# -- resolve_model_source -----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"])
def test_resolve_hub_ids_unchanged(model: str, no_ray: None) -> None:
    assert resolve_model_source(model, "/cache") == model


def test_resolve_a_local_model_folder_unchanged(source: Path, no_ray: None) -> None:
    assert resolve_model_source(str(source), "/cache") == str(source)


def test_resolve_a_missing_local_folder_raises_the_check_error(no_ray: None) -> None:
    with pytest.raises(FileNotFoundError) as info:
        resolve_model_source("/no/such/model", "/cache")

    with pytest.raises(FileNotFoundError) as expected:
        storage.check_model_source("/no/such/model")
    assert str(info.value) == str(expected.value)
    assert "/no/such/model" in str(info.value)


def test_resolve_a_local_folder_without_config_raises(tmp_path: Path, no_ray: None) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_source(str(tmp_path), "/cache")


def test_resolve_s3_without_shipped_credentials_is_unchanged(no_ray: None, tmp_path: Path) -> None:
    """The cluster's own credentials: Ray Data LLM fetches it itself; nothing is fetched here."""
    cache = tmp_path / "cache"

    assert resolve_model_source("s3://models/llama-3-8b/", str(cache)) == "s3://models/llama-3-8b/"

    assert not cache.exists()


def test_resolve_local_model_with_shipped_credentials_is_unchanged(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ray: None
) -> None:
    """Credentials only matter for s3:// models: a local folder is not fetched."""
    ship_credentials(tmp_path / "shipped", monkeypatch)

    assert resolve_model_source(str(source), str(tmp_path / "cache")) == str(source)


def test_resolve_s3_with_shipped_credentials_goes_to_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ray: None
) -> None:
    """The counter-check of the ``no_ray`` fixture: the fetch path does import Ray (so the tests
    above, which pass with Ray unimportable, really stay off it)."""
    ship_credentials(tmp_path / "shipped", monkeypatch)

    with pytest.raises(ImportError):
        resolve_model_source("s3://models/llama-3-8b", str(tmp_path / "cache"))


def test_resolve_without_credentials_does_not_load_ray(tmp_path: Path) -> None:
    """In a fresh interpreter, the non-fetch paths leave ``ray`` out of sys.modules."""
    code = (
        "import sys\n"
        "from airflow_provider_raybatch.pipeline.generate.models import resolve_model_source\n"
        "resolve_model_source('s3://models/m', '/cache')\n"
        "resolve_model_source('Qwen/Qwen2.5-0.5B-Instruct', '/cache')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )

    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_fetch_model_that_lost_a_race_keeps_the_winners_copy(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two fetches of one node both found no copy; the other one renamed its copy into place first."""
    target = tmp_path / "cache" / "m"
    real_rename = models.os.rename

    def other_fetch_wins(partial: str, destination: str) -> None:
        shutil.copytree(partial, destination)  # a complete copy of the same objects
        Path(destination, "the-winners").touch()
        real_rename(partial, destination)  # fails: the target is a non-empty folder now

    monkeypatch.setattr(models.os, "rename", other_fetch_wins)

    assert fetch_model(str(source), str(target)) == len(MODEL_FILES)

    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]
    assert (target / "the-winners").exists()


def test_fetch_model_over_an_incomplete_copy_replaces_it(source: Path, tmp_path: Path) -> None:
    """A copy there whose marker does not record what the source holds now is replaced, not served."""
    target = tmp_path / "cache" / "m"
    target.mkdir(parents=True, mode=0o700)
    (target / "config.json").write_bytes(b"an older copy's")
    (target / model_cache.COMPLETE_MARKER).write_bytes(b"")

    assert fetch_model(str(source), str(target)) == len(MODEL_FILES)

    assert files_under(target) == MODEL_FILES
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]


def test_fetch_model_that_fails_midway_leaves_no_partial_folder(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source file that vanishes during the copy fails the fetch; the files copied so far (GBs for
    a real model) must not stay behind in the cache as a ``.partial-*`` folder, one per retry."""
    cache = tmp_path / "cache"
    listed = storage.list_files(str(source))
    monkeypatch.setattr(storage, "list_files", lambda _: [*listed, f"{source}/zz-vanished.bin"])

    with pytest.raises(FileNotFoundError):
        fetch_model(str(source), str(cache / "m"))

    assert not cache.exists() or sorted(p.name for p in cache.iterdir()) == []


def test_nodes_on_one_host_fetching_at_once_leave_one_copy(source: Path, tmp_path: Path) -> None:
    """A local cluster's nodes share a disk: their fetches of one model run at once into one folder."""
    cache = tmp_path / "cache"
    target = cache / "m"
    copied: list[int] = []
    errors: list[BaseException] = []

    def node() -> None:
        try:
            copied.append(fetch_model(str(source), str(target), cache_dir=str(cache)))
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=node) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert len(copied) == 4 and set(copied) <= {0, len(MODEL_FILES)}
    assert sorted(p.name for p in cache.iterdir()) == ["m"]
    assert files_under(target) == MODEL_FILES
    assert fetch_model(str(source), str(target)) == 0
