"""Tests of airflow_provider_raybatch/pipeline/credentials.py and of how storage.py uses what it ships.

The paths through Ray's key-value store (the driver's copy, the workers' reads, the SIGTERM of a
job stop) run against a real cluster in tests/security/test_job_credentials.py; here: the upload the
operator makes, the paths that must not import Ray, the SIGTERM handler's order, and the consumers
(``S3Options`` / ``storage.filesystem``) of settings a driver holds. No S3 call is made: only pyarrow
filesystem objects are built and inspected.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs as pa_fs

from airflow_provider_raybatch.pipeline import credentials, storage
from airflow_provider_raybatch.pipeline.credentials import held_for_this_job, shipped_s3_settings
from airflow_provider_raybatch.pipeline.storage import S3Options
from airflow_provider_raybatch.shared.packaging import JOB_MODULE, build_job_package
from airflow_provider_raybatch.shared.s3_settings_upload import (
    S3_SETTING_NAMES,
    UPLOAD_PREFIX,
    settings_upload,
)

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
    """No cached S3 options or settings, no job package, no instance metadata lookups, before and after."""
    monkeypatch.setattr(storage, "_s3_options", None)
    monkeypatch.setattr(credentials, "_settings", None)
    monkeypatch.delitem(sys.modules, JOB_MODULE, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    sys.modules.pop(JOB_MODULE, None)


def ship_job_package(root: Path, monkeypatch: pytest.MonkeyPatch, settings_uri: str | None) -> None:
    """Unpack a job package under ``root`` and put it on the path, as Ray does with ``py_modules``."""
    with zipfile.ZipFile(
        io.BytesIO(build_job_package('{"spec": "unused here"}', settings_uri).data)
    ) as archive:
        archive.extractall(root)
    monkeypatch.syspath_prepend(str(root))


def hold(settings: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> None:
    """This process holds ``settings``, as the driver does inside :func:`held_for_this_job`."""
    monkeypatch.setattr(credentials, "_settings", dict(settings))


def reduced(filesystem: Any) -> dict[str, Any]:  # Any: pyarrow's reconstruction arguments.
    """The arguments pyarrow would rebuild an S3FileSystem from (what it was configured with)."""
    _, (arguments,) = filesystem.__reduce__()
    return arguments


# -- settings_upload (the Airflow side) ---------------------------------------------------------


def test_settings_upload_rejects_unknown_names_and_names_them() -> None:
    with pytest.raises(ValueError) as info:
        settings_upload({**SETTINGS, "aws_secret_access_key": "x", "bucket": "b"})

    message = str(info.value)
    assert "aws_secret_access_key" in message
    assert "bucket" in message
    assert "endpoint_url" not in message  # only the unknown ones are named
    assert SECRET not in message


@pytest.mark.parametrize("name", S3_SETTING_NAMES)
def test_settings_upload_accepts_each_known_name(name: str) -> None:
    assert json.loads(settings_upload({name: "v"}).data) == {name: "v"}


def test_settings_upload_holds_the_settings_and_is_no_zip() -> None:
    """Plain JSON: nothing could unpack it onto a disk even if a runtime_env named it."""
    upload = settings_upload(SETTINGS)

    assert json.loads(upload.data) == SETTINGS
    assert not zipfile.is_zipfile(io.BytesIO(upload.data))


def test_same_settings_give_different_random_names() -> None:
    first, second = settings_upload(SETTINGS), settings_upload(SETTINGS)

    assert first.uri != second.uri
    for upload in (first, second):
        assert upload.uri.startswith(UPLOAD_PREFIX) and upload.uri.endswith(".json")
        assert len(upload.uri.removeprefix(UPLOAD_PREFIX).removesuffix(".json")) == 32  # 128 random bits
        assert upload.name == upload.uri.removeprefix("gcs://")


def test_upload_name_does_not_carry_the_keys() -> None:
    upload = settings_upload(SETTINGS)

    for value in (SETTINGS["access_key"], SECRET, SETTINGS["session_token"]):
        assert value not in upload.uri


# -- the cluster side, where no Ray is needed ----------------------------------------------------


def test_shipped_settings_none_outside_a_job() -> None:
    assert shipped_s3_settings() is None


def test_shipped_settings_none_for_a_job_without_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship_job_package(tmp_path, monkeypatch, settings_uri=None)

    assert shipped_s3_settings() is None


def test_shipped_settings_are_the_ones_the_driver_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    hold(SETTINGS, monkeypatch)

    shipped = shipped_s3_settings()

    assert shipped == SETTINGS
    shipped["secret_key"] = "changed"  # a copy: callers cannot change what the process holds
    assert shipped_s3_settings() == SETTINGS


def test_settings_of_a_job_are_read_through_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter-check of the test below: a job package naming an upload does go to Ray's store."""
    ship_job_package(tmp_path, monkeypatch, settings_uri=f"{UPLOAD_PREFIX}{'0' * 32}.json")
    monkeypatch.setitem(sys.modules, "ray", None)  # type: ignore[arg-type]

    with pytest.raises(ImportError):
        shipped_s3_settings()
    with pytest.raises(ImportError), held_for_this_job():
        pass


@pytest.mark.parametrize(
    "pointer",
    ["gcs://_ray_pkg_0123456789abcdef0123456789abcdef01234567.zip", f"{UPLOAD_PREFIX}../x.json", "anything"],
)
def test_a_job_package_naming_another_key_is_refused_before_any_store_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pointer: str
) -> None:
    """The driver deletes the key it is pointed at: never one of Ray's own packages."""
    ship_job_package(tmp_path, monkeypatch, settings_uri=pointer)
    monkeypatch.setitem(sys.modules, "ray", None)  # type: ignore[arg-type]

    with pytest.raises(credentials.JobCredentialsError, match="no S3 settings upload"):
        shipped_s3_settings()
    with pytest.raises(credentials.JobCredentialsError), held_for_this_job():
        pass


def test_held_for_a_job_without_settings_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ship_job_package(tmp_path, monkeypatch, settings_uri=None)
    before = signal.getsignal(signal.SIGTERM)

    with held_for_this_job():
        assert shipped_s3_settings() is None
        assert signal.getsignal(signal.SIGTERM) is before


def test_paths_without_settings_do_not_load_ray(tmp_path: Path) -> None:
    """In a fresh interpreter: a job without S3 settings never imports Ray for them."""
    package = tmp_path / "job"
    with zipfile.ZipFile(io.BytesIO(build_job_package("{}").data)) as archive:
        archive.extractall(package)
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(package)!r})\n"
        "from airflow_provider_raybatch.pipeline.credentials import held_for_this_job, shipped_s3_settings\n"
        "from airflow_provider_raybatch.pipeline import storage\n"
        "with held_for_this_job():\n"
        "    assert shipped_s3_settings() is None\n"
        "    storage.s3_options()\n"
        "print('ray' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# -- the SIGTERM of a job stop ------------------------------------------------------------------


def test_sigterm_forgets_first_then_runs_the_previous_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []

    def previous(signum: int, frame: Any) -> None:  # Any: the interrupted frame.
        order.append("previous")

    original = signal.signal(signal.SIGTERM, previous)
    try:
        restore = credentials._forget_on_sigterm(lambda: order.append("forget"))
        os.kill(os.getpid(), signal.SIGTERM)
        assert order == ["forget", "previous"]
        restore()
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, original)


def test_sigterm_still_runs_the_previous_handler_when_forgetting_fails() -> None:
    order: list[str] = []

    def previous(signum: int, frame: Any) -> None:  # Any: the interrupted frame.
        order.append("previous")

    def forget() -> None:
        raise ConnectionError("GCS unreachable")

    original = signal.signal(signal.SIGTERM, previous)
    try:
        restore = credentials._forget_on_sigterm(forget)
        with pytest.raises(ConnectionError):
            os.kill(os.getpid(), signal.SIGTERM)
        assert order == ["previous"]
        restore()
    finally:
        signal.signal(signal.SIGTERM, original)


def test_sigterm_with_the_default_action_forgets_then_dies_of_it(tmp_path: Path) -> None:
    marker = tmp_path / "forgotten"
    code = (
        "import os, signal, pathlib\n"
        "from airflow_provider_raybatch.pipeline import credentials\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        f"credentials._forget_on_sigterm(lambda: pathlib.Path({str(marker)!r}).write_text('1'))\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('survived')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGTERM, (result.returncode, result.stderr)
    assert "survived" not in result.stdout
    assert marker.read_text() == "1"


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


def test_s3_options_are_the_shipped_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    hold(SETTINGS, monkeypatch)

    assert storage.s3_options() == S3Options(**SETTINGS)


def test_s3_options_default_without_shipped_settings() -> None:
    assert storage.s3_options() == S3Options()


def test_filesystem_of_an_s3_uri_uses_the_shipped_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    hold(SETTINGS, monkeypatch)

    filesystem, path = storage.filesystem("s3://bucket/key")

    assert path == "bucket/key"
    assert isinstance(filesystem, pa_fs.S3FileSystem)
    assert filesystem.region == "eu-west-1"
    arguments = reduced(filesystem)
    assert (arguments["endpoint_override"], arguments["scheme"]) == ("127.0.0.1:9000", "http")
    assert arguments["access_key"] == "AKIAUNITTESTKEY"


def test_filesystem_of_a_nested_s3_uri_keeps_the_whole_key(monkeypatch: pytest.MonkeyPatch) -> None:
    hold({"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}, monkeypatch)

    _, path = storage.filesystem("s3://bucket/a/b/c.jsonl")

    assert path == "bucket/a/b/c.jsonl"


def test_s3_options_are_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    first = storage.s3_options()  # nothing shipped yet
    hold(SETTINGS, monkeypatch)

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
    hold(SETTINGS, monkeypatch)

    filesystem, _ = storage.filesystem(str(tmp_path / "x.jsonl"))

    assert isinstance(filesystem, pa_fs.LocalFileSystem)
