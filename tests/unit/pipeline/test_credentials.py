"""Tests of airflow_provider_raybatch/pipeline/credentials.py and of how storage.py uses what it ships.

The ``S3Options`` / ``storage.filesystem`` tests live here too: they are the consumers of the shipped
settings. No S3 call is made: only pyarrow filesystem objects are built and inspected.
"""

from __future__ import annotations

import io
import json
import posixpath
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs as pa_fs

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.credentials import (
    CREDENTIALS_MODULE,
    S3_SETTING_NAMES,
    package_files,
    shipped_s3_settings,
)
from airflow_provider_raybatch.pipeline.storage import S3Options
from airflow_provider_raybatch.utils.packaging import build_package

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSECRET"
SETTINGS: dict[str, str | None] = {
    "endpoint_url": "http://127.0.0.1:9000",
    "region": "eu-west-1",
    "access_key": "AKIAUNITTESTKEY",
    "secret_key": SECRET,
    "session_token": "FQoGZXIvYXdzEUNITTOKEN",
}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No cached S3 options, no credentials module, no instance metadata lookups, before and after."""
    monkeypatch.setattr(storage, "_s3_options", None)
    monkeypatch.delitem(sys.modules, CREDENTIALS_MODULE, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    sys.modules.pop(CREDENTIALS_MODULE, None)


def ship(root: Path, settings: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Unpack the credentials package built from ``settings`` under ``root`` and make it importable,
    as Ray does with a ``py_modules`` zip."""
    with zipfile.ZipFile(io.BytesIO(build_package(package_files(settings)).data)) as archive:
        archive.extractall(root)
    monkeypatch.syspath_prepend(str(root))
    return root / CREDENTIALS_MODULE


def reduced(filesystem: Any) -> dict[str, Any]:  # Any: pyarrow's reconstruction arguments.
    """The arguments pyarrow would rebuild an S3FileSystem from (what it was configured with)."""
    _, (arguments,) = filesystem.__reduce__()
    return arguments


# -- package_files ------------------------------------------------------------------------------


def test_package_files_rejects_unknown_names_and_names_them() -> None:
    with pytest.raises(ValueError) as info:
        package_files({**SETTINGS, "aws_secret_access_key": "x", "bucket": "b"})

    message = str(info.value)
    assert "aws_secret_access_key" in message
    assert "bucket" in message
    assert "endpoint_url" not in message  # only the unknown ones are named


@pytest.mark.parametrize("name", S3_SETTING_NAMES)
def test_package_files_accepts_each_known_name(name: str) -> None:
    files = package_files({name: "v"})

    assert json.loads(files[f"{CREDENTIALS_MODULE}/s3.json"]) == {name: "v"}


def test_same_settings_give_different_package_uris() -> None:
    first = build_package(package_files(SETTINGS))
    second = build_package(package_files(SETTINGS))

    assert first.uri != second.uri
    assert first.data != second.data


def test_package_uri_does_not_carry_the_keys() -> None:
    package = build_package(package_files(SETTINGS))

    for value in (SETTINGS["access_key"], SECRET, SETTINGS["session_token"]):
        assert value not in package.uri


def test_package_zip_holds_the_module_and_the_settings() -> None:
    package = build_package(package_files(SETTINGS))

    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        names = set(archive.namelist())
        assert {f"{CREDENTIALS_MODULE}/__init__.py", f"{CREDENTIALS_MODULE}/s3.json"} <= names
        assert all(name.startswith(f"{CREDENTIALS_MODULE}/") for name in names)
        assert json.loads(archive.read(f"{CREDENTIALS_MODULE}/s3.json")) == SETTINGS
        compile(archive.read(f"{CREDENTIALS_MODULE}/__init__.py"), "__init__.py", "exec")
        assert archive.testzip() is None


# -- shipped_s3_settings ------------------------------------------------------------------------


def test_shipped_settings_none_without_the_module() -> None:
    assert shipped_s3_settings() is None


def test_shipped_settings_from_a_handwritten_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / CREDENTIALS_MODULE
    module.mkdir()
    (module / "__init__.py").write_text("")
    (module / "s3.json").write_text(json.dumps({"region": "us-east-2", "endpoint_url": None}))
    monkeypatch.syspath_prepend(str(tmp_path))

    assert shipped_s3_settings() == {"region": "us-east-2", "endpoint_url": None}


def test_shipped_settings_from_the_built_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ship(tmp_path, SETTINGS, monkeypatch)

    assert shipped_s3_settings() == SETTINGS


def test_shipped_settings_from_the_zip_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The package also works unextracted (zipimport), e.g. a zip on PYTHONPATH."""
    archive = tmp_path / "credentials.zip"
    archive.write_bytes(build_package(package_files(SETTINGS)).data)
    monkeypatch.syspath_prepend(str(archive))

    assert shipped_s3_settings() == SETTINGS


def test_module_is_gone_after_a_shipping_test() -> None:
    """The fixture's cleanup works: a later test sees no credentials (run after the ones above)."""
    assert CREDENTIALS_MODULE not in sys.modules
    assert shipped_s3_settings() is None


# -- S3Options ----------------------------------------------------------------------------------


def test_s3_options_repr_hides_the_keys() -> None:
    options = S3Options(**SETTINGS)

    text = repr(options)
    assert "AKIAUNITTESTKEY" not in text
    assert SECRET not in text
    assert "FQoGZXIvYXdzEUNITTOKEN" not in text
    assert "access_key" not in text and "secret_key" not in text and "session_token" not in text
    # The non-secret fields stay visible for debugging.
    assert "http://127.0.0.1:9000" in text
    assert "eu-west-1" in text
    assert str(options) == text


def test_s3_options_filesystem_with_a_custom_endpoint() -> None:
    filesystem = S3Options(**SETTINGS).filesystem()

    assert isinstance(filesystem, pa_fs.S3FileSystem)
    assert filesystem.region == "eu-west-1"
    arguments = reduced(filesystem)
    assert arguments["endpoint_override"] == "127.0.0.1:9000"
    assert arguments["scheme"] == "http"
    assert arguments["access_key"] == "AKIAUNITTESTKEY"
    assert arguments["secret_key"] == SECRET
    assert arguments["session_token"] == "FQoGZXIvYXdzEUNITTOKEN"


def test_s3_options_https_endpoint_with_a_path_less_host() -> None:
    arguments = reduced(S3Options(endpoint_url="https://minio.example.com", region="us-east-1").filesystem())

    assert arguments["endpoint_override"] == "minio.example.com"
    assert arguments["scheme"] == "https"


def test_s3_options_without_settings_use_the_cluster_defaults() -> None:
    arguments = reduced(S3Options(region="us-east-1").filesystem())

    assert arguments["endpoint_override"] == ""
    assert arguments["scheme"] == "https"
    assert not arguments["access_key"]  # pyarrow reports None or "" for "not given"
    assert not arguments["secret_key"]
    assert arguments["anonymous"] is False


def test_s3_options_without_a_session_token() -> None:
    settings = {**SETTINGS, "session_token": None}

    arguments = reduced(S3Options(**settings).filesystem())

    assert arguments["access_key"] == "AKIAUNITTESTKEY"
    assert arguments["secret_key"] == SECRET
    assert not arguments["session_token"]


# -- storage.filesystem and s3_options ----------------------------------------------------------


def test_s3_options_are_the_shipped_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ship(tmp_path, SETTINGS, monkeypatch)

    assert storage.s3_options() == S3Options(**SETTINGS)


def test_s3_options_default_without_shipped_settings() -> None:
    assert storage.s3_options() == S3Options()


def test_filesystem_of_an_s3_uri_uses_the_shipped_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship(tmp_path, SETTINGS, monkeypatch)

    filesystem, path = storage.filesystem("s3://bucket/key")

    assert path == "bucket/key"
    assert isinstance(filesystem, pa_fs.S3FileSystem)
    assert filesystem.region == "eu-west-1"
    arguments = reduced(filesystem)
    assert (arguments["endpoint_override"], arguments["scheme"]) == ("127.0.0.1:9000", "http")
    assert arguments["access_key"] == "AKIAUNITTESTKEY"


def test_filesystem_of_a_nested_s3_uri_keeps_the_whole_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship(tmp_path, {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}, monkeypatch)

    _, path = storage.filesystem("s3://bucket/a/b/c.jsonl")

    assert path == "bucket/a/b/c.jsonl"


def test_s3_options_are_read_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = storage.s3_options()  # nothing shipped yet
    ship(tmp_path, SETTINGS, monkeypatch)

    assert storage.s3_options() is first


@pytest.mark.parametrize("relative", ["data/in.jsonl", "./data/in.jsonl", "data/../data/in.jsonl"])
def test_filesystem_of_a_local_path(relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    filesystem, path = storage.filesystem(relative)

    assert isinstance(filesystem, pa_fs.LocalFileSystem)
    assert posixpath.isabs(path)
    assert path == posixpath.join(str(tmp_path), "data/in.jsonl")


def test_filesystem_of_an_absolute_local_path() -> None:
    filesystem, path = storage.filesystem("/data/in/")

    assert isinstance(filesystem, pa_fs.LocalFileSystem)
    assert path == "/data/in"


def test_local_paths_ignore_shipped_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ship(tmp_path, SETTINGS, monkeypatch)

    filesystem, _ = storage.filesystem(str(tmp_path / "x.jsonl"))

    assert isinstance(filesystem, pa_fs.LocalFileSystem)
