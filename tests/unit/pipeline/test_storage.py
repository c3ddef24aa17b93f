"""Tests of airflow_provider_raybatch/pipeline/storage.py.

The URI arithmetic always runs; the filesystem helpers use pyarrow and run on local disk where it is
installed (they skip otherwise). S3 is left to the integration tests.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.storage import (
    OutputLayout,
    check_model_source,
    extensions_for,
    relative_name,
)

RUN_KEY = "classify-m-1-0123456789abcdef"


# -- OutputLayout -------------------------------------------------------------------------------


@pytest.mark.parametrize("output_uri", ["s3://b/out", "s3://b/out/", "s3://b/out//"])
def test_output_layout_on_s3(output_uri: str) -> None:
    layout = OutputLayout(output_uri, RUN_KEY)

    assert layout.manifest_uri == "s3://b/out/manifest.json"
    assert layout.staging_uri == f"s3://b/out/_staging/{RUN_KEY}"
    assert layout.staged_spec_uri == f"s3://b/out/_staging/{RUN_KEY}/spec.json"
    assert layout.version_uri("20261121T000000-x") == "s3://b/out/versions/20261121T000000-x"


@pytest.mark.parametrize("output_uri", ["/data/out", "/data/out/", "file:///data/out"])
def test_output_layout_on_local_disk(output_uri: str) -> None:
    layout = OutputLayout(output_uri, "manual")
    base = output_uri.rstrip("/")

    assert layout.manifest_uri == f"{base}/manifest.json"
    assert layout.staging_uri == f"{base}/_staging/manual"
    assert layout.staged_spec_uri == f"{base}/_staging/manual/spec.json"
    assert layout.version_uri("v1") == f"{base}/versions/v1"


def test_output_layout_of_a_relative_folder() -> None:
    layout = OutputLayout("out", "k")

    assert layout.manifest_uri == "out/manifest.json"
    assert layout.staging_uri == "out/_staging/k"


def test_staging_is_per_run_key() -> None:
    first, second = OutputLayout("s3://b/out", "run-a"), OutputLayout("s3://b/out", "run-b")

    assert first.staging_uri != second.staging_uri
    assert first.manifest_uri == second.manifest_uri  # one output folder, one manifest


def test_new_version_names_are_time_ordered_and_unique() -> None:
    layout = OutputLayout("s3://b/out", RUN_KEY)

    versions = [layout.new_version() for _ in range(50)]

    assert len(set(versions)) == 50
    for version in versions:
        assert re.fullmatch(rf"\d{{8}}T\d{{6}}-{RUN_KEY[-12:]}-[0-9a-f]{{6}}", version), version
    stamps = [version.split("-", 1)[0] for version in versions]
    assert stamps == sorted(stamps)


def test_new_version_of_a_short_run_key() -> None:
    assert re.fullmatch(r"\d{8}T\d{6}-manual-[0-9a-f]{6}", OutputLayout("out", "manual").new_version())


@pytest.mark.parametrize(
    ("parts", "joined"),
    [
        (("s3://b/out", "versions", "v1"), "s3://b/out/versions/v1"),
        (("s3://b/out/", "/_staging/", "k/"), "s3://b/out/_staging/k"),
        (("file:///data/out//", "outputs", "part-a.jsonl"), "file:///data/out/outputs/part-a.jsonl"),
        (("/data/out", "parts/part-a.json"), "/data/out/parts/part-a.json"),
        (("out",), "out"),
    ],
)
def test_join(parts: tuple[str, ...], joined: str) -> None:
    assert storage.join(*parts) == joined


# -- pure helpers ---------------------------------------------------------------------------------


def test_relative_name() -> None:
    assert relative_name("b/in/sub/x.jsonl", "s3://b/in/") == "sub/x.jsonl"
    assert relative_name("s3://b/in/sub/x.jsonl", "s3://b/in") == "sub/x.jsonl"
    assert relative_name("b/in/x.jsonl", "s3://b/in/x.jsonl") == "x.jsonl"
    assert relative_name("b/input_2/x.jsonl", "s3://b/in") == "x.jsonl"
    cwd = posixpath.abspath(".")
    assert relative_name(f"{cwd}/data/in/part/a.csv", "data/in") == "part/a.csv"
    assert relative_name("/data/in/a/b/c.csv", "/data/in/") == "a/b/c.csv"


def test_input_folder() -> None:
    """Relative image paths are read from the folder of the input file that names them."""
    assert storage.input_folder("s3://b/in/images.parquet", "images.parquet") == "s3://b/in"
    assert storage.input_folder("s3://b/in/", "images.parquet") == "s3://b/in"
    assert storage.input_folder("s3://b/in", "day/2026/images.parquet") == "s3://b/in/day/2026"
    assert storage.input_folder("/data/in/images.parquet", "images.parquet") == "/data/in"
    assert storage.input_folder("/data/in", "part/a.parquet") == "/data/in/part"
    assert storage.input_folder("images.parquet", "images.parquet") == "."


def test_check_model_source(tmp_path: Path) -> None:
    check_model_source("Qwen/Qwen2.5-0.5B-Instruct")  # a Hub id: left to vLLM
    check_model_source("s3://bucket/models/qwen")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        check_model_source(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        check_model_source(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_model_source(str(tmp_path))


# -- local filesystem (pyarrow) -------------------------------------------------------------------


@pytest.fixture
def pa_fs() -> Any:  # Any: the pyarrow.fs module.
    return pytest.importorskip("pyarrow.fs")


def test_filesystem_of_local_paths(pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    filesystem, path = storage.filesystem("rel/out")
    assert isinstance(filesystem, pa_fs.LocalFileSystem)
    assert path == f"{tmp_path}/rel/out"

    filesystem, path = storage.filesystem(f"file://{tmp_path}/out")
    assert isinstance(filesystem, pa_fs.LocalFileSystem)
    assert path == f"{tmp_path}/out"


def test_write_text_and_read_text(pa_fs: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "a" / "b" / "manifest.json")

    storage.write_text(uri, '{"status": "complete", "note": "Société 🚀"}')

    assert storage.read_text(uri) == '{"status": "complete", "note": "Société 🚀"}'


def _crashing_local_filesystem(pa_fs: Any, fail_on: str) -> Any:  # Any: pyarrow.fs module and filesystem.
    """A LocalFileSystem (so write_bytes takes its local branch) that records the paths it opens for
    writing and whose writes die part way.

    ``fail_on="write"``: an output stream takes a few bytes and then fails (a full disk, a kill);
    ``fail_on="move"``: the rename fails after the temporary file was written; otherwise nothing fails.
    """

    class Crashing(pa_fs.LocalFileSystem):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.opened: list[str] = []

        def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> Any:  # Any: pyarrow's.
            self.opened.append(path)
            if fail_on != "write":
                return super().open_output_stream(path, *args, **kwargs)
            with super().open_output_stream(path, *args, **kwargs) as stream:
                stream.write(b'{"torn')
            raise OSError("No space left on device")

        def move(self, src: str, dest: str) -> None:
            if fail_on == "move":
                raise OSError("Input/output error")
            super().move(src, dest)

    return Crashing()


@pytest.mark.parametrize("fail_on", ["write", "move"])
@pytest.mark.parametrize("scheme", ["", "file://"], ids=["plain-path", "file-uri"])
def test_write_bytes_never_leaves_a_torn_file_or_a_temporary_one(
    pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, fail_on: str
) -> None:
    """Readers follow manifest.json: a failed rewrite must leave the old one whole, and nothing else."""
    uri = f"{scheme}{tmp_path}/out/manifest.json"
    storage.write_bytes(uri, b'{"version": "old"}')
    real = storage.filesystem
    crashing = _crashing_local_filesystem(pa_fs, fail_on)
    monkeypatch.setattr(storage, "filesystem", lambda uri_: (crashing, real(uri_)[1]))

    with pytest.raises(OSError, match="No space left" if fail_on == "write" else "Input/output"):
        storage.write_bytes(uri, b'{"version": "new"}')

    monkeypatch.undo()
    assert storage.read_text(uri) == '{"version": "old"}'
    assert os.listdir(tmp_path / "out") == ["manifest.json"]  # the temporary file is gone
    assert crashing.opened and f"{tmp_path}/out/manifest.json" not in crashing.opened


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["plain-path", "file-uri"])
def test_write_bytes_writes_through_a_temporary_file_on_local_disk(
    pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    real = storage.filesystem
    recording = _crashing_local_filesystem(pa_fs, fail_on="nothing")
    monkeypatch.setattr(storage, "filesystem", lambda uri_: (recording, real(uri_)[1]))

    storage.write_bytes(f"{scheme}{tmp_path}/a/b/part.json", b"\x00binary\xff")

    assert (tmp_path / "a" / "b" / "part.json").read_bytes() == b"\x00binary\xff"
    [temporary] = recording.opened
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/a/b/part\.json\.tmp-[0-9a-f]{{8}}", temporary)
    assert os.listdir(tmp_path / "a" / "b") == ["part.json"]


def test_write_bytes_on_an_object_store_writes_the_object_once(
    pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a LocalFileSystem (S3): one PUT of the object itself, no temporary object, no rename."""
    store = pa_fs.SubTreeFileSystem(str(tmp_path), pa_fs.LocalFileSystem())
    monkeypatch.setattr(storage, "filesystem", lambda uri_: (store, uri_.split("://", 1)[1]))

    storage.write_bytes("s3://bucket/out/manifest.json", b"{}")

    assert (tmp_path / "bucket" / "out" / "manifest.json").read_bytes() == b"{}"
    assert os.listdir(tmp_path / "bucket" / "out") == ["manifest.json"]


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["plain-path", "file-uri"])
def test_write_bytes_replaces_and_write_text_encodes_utf8(pa_fs: Any, tmp_path: Path, scheme: str) -> None:
    uri = f"{scheme}{tmp_path}/manifest.json"
    storage.write_bytes(uri, b"old content that is longer than the new one")

    storage.write_text(uri, "Société 🚀")

    assert (tmp_path / "manifest.json").read_bytes() == "Société 🚀".encode()
    assert os.listdir(tmp_path) == ["manifest.json"]


# -- extensions_for: a folder is filtered by the format's extensions, one named file never is ----------


def test_extensions_for_a_single_local_file_with_an_unknown_suffix(pa_fs: Any, tmp_path: Path) -> None:
    """``data.txt`` + input_format="jsonl" is what our error message advises: it must be read."""
    (tmp_path / "data.txt").write_text('{"a": 1}\n')

    assert extensions_for(str(tmp_path / "data.txt"), "jsonl") is None
    assert extensions_for(f"file://{tmp_path}/data.txt", "csv") is None


def test_extensions_for_single_local_files_with_or_without_a_suffix(pa_fs: Any, tmp_path: Path) -> None:
    files = {"in.jsonl": "jsonl", "in.csv": "csv", "in.pq": "parquet", "rows": "csv"}
    for name, input_format in files.items():
        (tmp_path / name).write_text("x")

        assert extensions_for(str(tmp_path / name), input_format) is None, name


@pytest.mark.parametrize("folder", ["in", "2026.01.02", "out.parquet"])
def test_extensions_for_a_local_folder(pa_fs: Any, tmp_path: Path, folder: str) -> None:
    """A folder is filtered, also one whose name looks like a file's (a Spark ``out.parquet``)."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "_SUCCESS").write_text("")
    uri = str(tmp_path / folder)

    assert extensions_for(uri, "jsonl") == ["jsonl", "ndjson", "json"]
    assert extensions_for(uri, "csv") == ["csv"]
    assert extensions_for(uri + "/", "parquet") == ["parquet", "pq"]


def test_extensions_for_a_missing_path_filters_so_ray_reports_it_missing(pa_fs: Any, tmp_path: Path) -> None:
    assert extensions_for(str(tmp_path / "missing.txt"), "jsonl") == ["jsonl", "ndjson", "json"]


def test_extensions_for_a_trailing_slash_asks_no_filesystem(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_filesystem(uri: str) -> Any:  # Any: never returns
        raise AssertionError(f"asked the filesystem about {uri}")

    monkeypatch.setattr(storage, "filesystem", no_filesystem)

    assert extensions_for("s3://b/in/", "jsonl") == ["jsonl", "ndjson", "json"]
    assert extensions_for("s3://b/data.csv/", "csv") == ["csv"]


@pytest.mark.parametrize(
    ("uri", "extensions"),
    [
        ("s3://bucket/in/data.txt", None),
        ("s3://bucket/in/data.csv", None),
        ("s3://bucket/in/customers", None),  # a file without a suffix
        ("s3://bucket/in", ["csv"]),
        ("s3://bucket/2026.01.02", ["csv"]),  # a folder with a dot in its name
        ("s3://bucket/missing", ["csv"]),
    ],
)
def test_extensions_for_on_an_object_store(
    pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str, extensions: list[str] | None
) -> None:
    """S3 is asked what the URI is (a local tree stands in for the bucket, as above)."""
    for name in ["in/data.txt", "in/data.csv", "in/customers", "2026.01.02/a.csv"]:
        (tmp_path / "bucket" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "bucket" / name).write_text("x")
    store = pa_fs.SubTreeFileSystem(str(tmp_path), pa_fs.LocalFileSystem())
    monkeypatch.setattr(storage, "filesystem", lambda uri_: (store, uri_.split("://", 1)[1]))

    assert extensions_for(uri, "csv") == extensions


def test_one_s3_filesystem_per_settings_shared_by_every_call() -> None:
    """A new S3FileSystem per call built a new client and connection for every small GET or PUT (a
    commit reads one sidecar per part); equal settings now share one, other settings get their own."""
    pytest.importorskip("pyarrow.fs")
    settings = {"region": "us-east-1", "access_key": "k", "secret_key": "s3cr3t-value"}
    options = storage.S3Options(endpoint_url="http://127.0.0.1:1", **settings)
    same = storage.S3Options(endpoint_url="http://127.0.0.1:1", **settings)
    other = storage.S3Options(endpoint_url="http://127.0.0.1:2", **settings)
    assert options.filesystem() is same.filesystem()
    assert options.filesystem() is not other.filesystem()
    assert "s3cr3t-value" not in repr(options)  # the cache key's repr (in a traceback, say) hides it


@pytest.mark.parametrize(
    ("uri", "input_format", "why"),
    [
        ("day/2026-11-20.jsonl", "jsonl", "no such file or folder"),  # a backfill date whose file never came
        ("no-such-folder/", "csv", "no such file or folder"),
        ("empty", "jsonl", "holds no jsonl or ndjson or json file"),
        ("other", "parquet", "holds no parquet or pq file"),  # files, none of the format asked for
    ],
)
def test_an_input_uri_with_nothing_to_read_fails_naming_it(
    pa_fs: Any, tmp_path: Path, uri: str, input_format: str, why: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "rows.csv").write_text("id\n1\n")
    input_uri = str(tmp_path / uri)

    with pytest.raises(storage.InputNotFoundError) as info:
        storage.input_file_sizes(input_uri, extensions_for(input_uri, input_format))  # type: ignore[arg-type]
    assert f"input_uri={input_uri!r}" in str(info.value) and why in str(info.value)
    assert "No row was read or generated" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)  # what a caller of pyarrow or Ray Data would catch


def test_an_input_uri_on_an_object_store_with_nothing_to_read_fails_naming_it(
    pa_fs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bucket" / "in").mkdir(parents=True)
    (tmp_path / "bucket" / "in" / "a.jsonl").write_text("{}\n")
    store = pa_fs.SubTreeFileSystem(str(tmp_path), pa_fs.LocalFileSystem())
    monkeypatch.setattr(storage, "filesystem", lambda uri_: (store, uri_.split("://", 1)[1]))

    assert [size for _, size in storage.input_file_sizes("s3://bucket/in", ["jsonl"])] == [3]
    with pytest.raises(
        storage.InputNotFoundError, match=r"input_uri='s3://bucket/in/2026-11-21.jsonl': no such"
    ):
        storage.input_file_sizes("s3://bucket/in/2026-11-21.jsonl", None)


_LISTINGS = """
import json
from pyarrow import fs
from ray.data.datasource.file_meta_provider import _expand_directory
from ray.data.datasource.path_util import _has_file_extension
from airflow_provider_raybatch.pipeline import storage

extensions = storage.extensions_for(FOLDER, "jsonl")
ours = [path for path, _ in storage.input_file_sizes(FOLDER, extensions)]
listed = _expand_directory(FOLDER, fs.LocalFileSystem())
rays = [path for path, _ in listed if _has_file_extension(path, extensions)]
print(json.dumps({"ours": sorted(ours), "rays": sorted(rays)}))
"""


def test_a_folder_lists_exactly_the_files_ray_data_reads(tmp_path: Path) -> None:
    """The start-up check, the input's binding and the prepared rows' key list the files the read will
    read: names starting with '.' or '_' directly under the folder skipped, extensions in any case."""
    from tests.unit.pipeline.ray_env import run_in_ray_env

    names = [
        "a.jsonl",
        "B.JSONL",
        "c.NdJson",
        "_SUCCESS",
        ".DS_Store",
        "_tmp/x.jsonl",
        ".hidden/y.jsonl",
        "sub/_z.jsonl",
        "sub/.w.jsonl",
        "sub/deep/v.json",
        "notes.txt",
        "dxjsonl",
        "e.jsonl.gz",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}\n")

    listed = run_in_ray_env(f"FOLDER = {str(tmp_path)!r}\n{_LISTINGS}")

    expected = ["B.JSONL", "a.jsonl", "c.NdJson", "sub/.w.jsonl", "sub/_z.jsonl", "sub/deep/v.json"]
    assert listed["rays"] == [str(tmp_path / name) for name in expected]
    assert listed["ours"] == listed["rays"]


@pytest.mark.parametrize(
    ("name", "elsewhere"),
    [
        ("a.jsonl", False),
        ("sub/b.jsonl", False),
        ("..a/b...jsonl", False),  # dots inside a name are a name
        ("sub/../../x.jsonl", True),
        ("./a.jsonl", True),
        ("sub//a.jsonl", True),
        ("sub/.", True),
    ],
)
def test_resolves_elsewhere_names_keys_a_client_resolves(name: str, elsewhere: bool) -> None:
    assert storage.resolves_elsewhere(name) is elsewhere
