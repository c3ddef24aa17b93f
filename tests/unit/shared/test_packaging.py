"""Tests of airflow_provider_raybatch/shared/packaging.py: content-addressed py_modules zips, what a
module folder ships (and what never), and the generated job package with its cluster-side reader."""

from __future__ import annotations

import io
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_raybatch.shared import packaging
from airflow_provider_raybatch.shared.packaging import (
    JOB_MODULE,
    MAX_MODULE_BYTES,
    S3_SETTINGS_URI_FILE,
    SPEC_FILE,
    RayPackage,
    build_job_package,
    build_py_module_package,
    read_job_file,
)

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


# -- what a module folder never ships -----------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    [
        ".env",
        ".envrc",
        ".netrc",
        ".git/config",
        ".git/objects/ab/cdef",
        ".aws/credentials",
        ".ssh/id_rsa",
        ".venv/lib/site.py",
        "sub/.secrets/token.txt",
        "sub/.hidden.py",
        "server.pem",
        "certs/tls.key",
        "store.p12",
        "store.pfx",
        "CERT.PEM",
        "id_rsa",
        "id_rsa.pub",
        "id_dsa",
        "keys/id_ecdsa",
        "id_ed25519",
        "node_modules/left-pad/index.js",
        "sub/site-packages/x.py",
        "__pycache__/fns.cpython-311.pyc",
        "stray.pyo",
    ],
)
def test_hidden_secret_and_dependency_files_are_left_out(tmp_path: Path, relative: str) -> None:
    package_dir = make_package(tmp_path)
    (package_dir / relative).parent.mkdir(parents=True, exist_ok=True)
    (package_dir / relative).write_text("AWS_SECRET_ACCESS_KEY=do-not-ship\n")

    package = build_py_module_package(package_dir)

    assert f"user_pkg/{relative}" not in names_in(package)
    assert names_in(package) == names_in(build_py_module_package(make_package(tmp_path / "clean")))


def test_prompt_templates_and_data_files_are_shipped(tmp_path: Path) -> None:
    package_dir = make_package(tmp_path)
    (package_dir / "prompts").mkdir()
    (package_dir / "prompts" / "template.txt").write_text("Classify {Company}.")
    (package_dir / "keys.json").write_text("{}")  # a name alone is no secret

    names = names_in(build_py_module_package(package_dir))

    assert {"user_pkg/prompts/template.txt", "user_pkg/keys.json", "user_pkg/fns.py"} <= set(names)


def test_a_virtualenv_folder_is_not_walked(tmp_path: Path) -> None:
    package_dir = make_package(tmp_path)
    venv = package_dir / "env"
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "dep.py").write_text("")

    assert not any(
        name.startswith("user_pkg/env/") for name in names_in(build_py_module_package(package_dir))
    )


def test_a_symlink_out_of_the_folder_is_left_out_and_one_inside_is_shipped(tmp_path: Path) -> None:
    outside = tmp_path / "credentials"
    outside.write_text("[default]\naws_secret_access_key = do-not-ship\n")
    package_dir = make_package(tmp_path)
    (package_dir / "creds.txt").symlink_to(outside)
    (package_dir / "same.json").symlink_to(package_dir / "data.json")
    (package_dir / "linked_dir").symlink_to(tmp_path, target_is_directory=True)

    package = build_py_module_package(package_dir)

    names = names_in(package)
    assert "user_pkg/creds.txt" not in names
    assert not any(name.startswith("user_pkg/linked_dir") for name in names)
    assert "user_pkg/same.json" in names
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        assert all(b"do-not-ship" not in archive.read(name) for name in names)


def test_a_folder_over_the_size_cap_fails_naming_the_largest_files(tmp_path: Path) -> None:
    package_dir = make_package(tmp_path)
    (package_dir / "data").mkdir()
    with open(package_dir / "data" / "embeddings.bin", "wb") as sparse:  # no bytes written: a sparse file
        sparse.truncate(MAX_MODULE_BYTES + 1)

    with pytest.raises(ValueError) as info:
        build_py_module_package(package_dir)

    message = str(info.value)
    assert str(package_dir) in message
    assert "user_pkg/data/embeddings.bin (64.0 MiB)" in message
    assert "read it from input_uri" in message


def test_a_folder_at_the_size_cap_ships(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package_dir = make_package(tmp_path)
    files_bytes = sum(path.stat().st_size for path in package_dir.rglob("*.py")) + len('{"k": 1}')
    monkeypatch.setattr(packaging, "MAX_MODULE_BYTES", files_bytes)

    assert "user_pkg/fns.py" in names_in(build_py_module_package(package_dir))


# -- the job package ----------------------------------------------------------------------------


@pytest.fixture
def no_job_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delitem(sys.modules, JOB_MODULE, raising=False)
    yield
    sys.modules.pop(JOB_MODULE, None)


def test_job_package_layout() -> None:
    package = build_job_package('{"model": "m"}', "gcs://raybatch_s3_settings_0.json")

    assert names_in(package) == [
        f"{JOB_MODULE}/__init__.py",
        f"{JOB_MODULE}/{S3_SETTINGS_URI_FILE}",
        f"{JOB_MODULE}/{SPEC_FILE}",
    ]
    assert URI.fullmatch(package.uri)
    assert names_in(build_job_package('{"model": "m"}')) == [
        f"{JOB_MODULE}/__init__.py",
        f"{JOB_MODULE}/{SPEC_FILE}",
    ]


def test_job_package_is_content_addressed() -> None:
    assert build_job_package("{}").uri == build_job_package("{}").uri
    assert build_job_package("{}").uri != build_job_package('{"a": 1}').uri
    assert build_job_package("{}", "gcs://a.json").uri != build_job_package("{}", "gcs://b.json").uri


@pytest.mark.parametrize("unpacked", [True, False], ids=["unpacked", "zip on the path"])
def test_read_job_file_as_the_cluster_sees_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_job_module: None, unpacked: bool
) -> None:
    spec_json = '{"system_prompt": "' + "é" * 200_000 + '"}'
    data = build_job_package(spec_json, "gcs://raybatch_s3_settings_0.json").data
    if unpacked:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
    else:
        (tmp_path / "job.zip").write_bytes(data)
        monkeypatch.syspath_prepend(str(tmp_path / "job.zip"))

    assert read_job_file(SPEC_FILE) == spec_json.encode()
    assert read_job_file(S3_SETTINGS_URI_FILE) == b"gcs://raybatch_s3_settings_0.json"
    assert read_job_file("missing") is None


def test_read_job_file_outside_a_job_is_none(no_job_module: None) -> None:
    assert read_job_file(SPEC_FILE) is None
    assert JOB_MODULE not in sys.modules


# -- the provider's own package ------------------------------------------------------------------


def test_the_provider_package_ships_every_module_of_ours_whatever_its_name() -> None:
    """The DAG-author filters (``credentials.*``, ``*secret*``) once left pipeline/credentials.py out of
    the provider's package: every job's driver failed to import it on a cluster without the provider."""
    import zipfile

    import airflow_provider_raybatch
    from airflow_provider_raybatch.jobs import job_shipping
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    root = Path(airflow_provider_raybatch.__file__).parent
    ours = {
        (Path(root.name) / path.relative_to(root)).as_posix()
        for path in root.rglob("*.py")
        if "__pycache__" not in path.parts
    }
    spec = BatchInferenceSpec.build(
        model="m", input_uri="/in/x.jsonl", output_uri="/out", user_template="{x}"
    )
    provider = job_shipping.module_packages(spec)[0]
    shipped = set(zipfile.ZipFile(io.BytesIO(provider.data)).namelist())
    assert shipped == ours
    assert "airflow_provider_raybatch/pipeline/credentials.py" in shipped


def test_the_shipped_pipeline_imports_on_a_cluster_without_the_provider(tmp_path: Path) -> None:
    """What a job's driver and replicas import, from the shipped package alone: unzipped into an empty
    folder, in the cluster's environment, with neither this checkout nor an installed provider on the
    path (the local test cluster's jobs could see the checkout, which hid the missing module)."""
    import subprocess
    import zipfile

    import airflow_provider_raybatch
    from tests.unit.pipeline.ray_env import RAY_PYTHON

    if not RAY_PYTHON.exists():
        pytest.fail(".venvs/ray is missing (scripts/setup_envs.sh makes it)")
    package = packaging.build_provider_package(Path(airflow_provider_raybatch.__file__).parent)
    zipfile.ZipFile(io.BytesIO(package.data)).extractall(tmp_path / "shipped")
    modules = sorted(  # every module of this checkout's pipeline, shipped or not
        f"airflow_provider_raybatch.pipeline.{path.stem}"
        for path in (Path(airflow_provider_raybatch.__file__).parent / "pipeline").glob("*.py")
        if path.stem != "__main__"
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(tmp_path / 'shipped')!r}), module.__file__\n"
        "print('imported', len(sys.modules))\n"
    )
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PYTHONPATH": str(tmp_path / "shipped"),
            "PATH": "/usr/bin:/bin",
            "RAY_ENABLE_AUTO_CONNECT": "0",
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "imported" in result.stdout
