"""Tests of airflow_provider_raybatch/utils/packaging.py: content-addressed py_modules zips."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest

from airflow_provider_raybatch.utils.packaging import RayPackage, build_py_module_package

URI = re.compile(r"gcs://_ray_pkg_[0-9a-f]{40}\.zip")


def make_package(root: Path, name: str = "user_pkg", body: str = "VALUE = 1\n") -> Path:
    package = root / name
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fns.py").write_text(body)
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "deep.py").write_text("DEEP = True\n")
    (package / "data.json").write_text('{"k": 1}')
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "fns.cpython-311.pyc").write_bytes(b"\x00compiled")
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "deep.cpython-311.pyc").write_bytes(b"\x00compiled")
    (package / "stray.pyc").write_bytes(b"\x00compiled")
    return package


def names_in(package: RayPackage) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        return sorted(archive.namelist())


def test_package_dir_is_zipped_under_its_own_name(tmp_path: Path) -> None:
    package = build_py_module_package(make_package(tmp_path))

    assert names_in(package) == [
        "user_pkg/__init__.py",
        "user_pkg/data.json",
        "user_pkg/fns.py",
        "user_pkg/sub/__init__.py",
        "user_pkg/sub/deep.py",
    ]
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        assert archive.read("user_pkg/fns.py") == b"VALUE = 1\n"
        assert archive.testzip() is None


def test_single_file_module_is_at_the_zip_root(tmp_path: Path) -> None:
    module = tmp_path / "helpers.py"
    module.write_text("def pre(row):\n    return row\n")

    package = build_py_module_package(module)

    assert names_in(package) == ["helpers.py"]


def test_uri_and_name(tmp_path: Path) -> None:
    package = build_py_module_package(make_package(tmp_path))

    assert URI.fullmatch(package.uri), package.uri
    assert package.name == package.uri.removeprefix("gcs://")
    assert not package.name.startswith("gcs")


def test_same_content_gives_same_uri_and_bytes(tmp_path: Path) -> None:
    first = build_py_module_package(make_package(tmp_path / "a"))
    second_dir = make_package(tmp_path / "b")
    (second_dir / "__pycache__" / "other.cpython-311.pyc").write_bytes(b"different cache")

    second = build_py_module_package(second_dir)

    assert first.uri == second.uri
    assert first.data == second.data


def test_changed_content_gives_different_uri(tmp_path: Path) -> None:
    first = build_py_module_package(make_package(tmp_path / "a", body="VALUE = 1\n"))
    second = build_py_module_package(make_package(tmp_path / "b", body="VALUE = 2\n"))

    assert first.uri != second.uri


def test_renamed_package_gives_different_uri(tmp_path: Path) -> None:
    first = build_py_module_package(make_package(tmp_path, name="pkg_a"))
    second = build_py_module_package(make_package(tmp_path, name="pkg_b"))

    assert first.uri != second.uri


def test_added_file_gives_different_uri(tmp_path: Path) -> None:
    package_dir = make_package(tmp_path)
    before = build_py_module_package(package_dir)
    (package_dir / "extra.py").write_text("")

    assert build_py_module_package(package_dir).uri != before.uri


def test_relative_path_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_package(tmp_path)
    monkeypatch.chdir(tmp_path)

    assert names_in(build_py_module_package("user_pkg"))[0] == "user_pkg/__init__.py"


def test_non_python_file_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("x")

    with pytest.raises(ValueError, match="neither a package directory nor a .py file"):
        build_py_module_package(text)


def test_empty_dir_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty_pkg"
    (empty / "__pycache__").mkdir(parents=True)
    (empty / "__pycache__" / "x.pyc").write_bytes(b"")

    with pytest.raises(ValueError, match="holds no files"):
        build_py_module_package(empty)
