"""Zip local code into the content-addressed packages Ray's ``runtime_env`` ``py_modules`` expects.

Ray's own SDK does this through ``ray._private``; we talk to the Jobs REST API without Ray
installed, so we build the same layout: a package directory is zipped with its own name as the
top-level folder, a single-file module at the zip's root, and the URI is
``gcs://_ray_pkg_<hash>.zip`` where the hash covers every file's relative path and bytes.

**What a package folder ships.** Every file a DAG author's module may read (code, prompt templates,
small data files), and none of what never belongs on a cluster, where every node unpacks the zip
and keeps it for the Ray session: hidden files and folders (``.env``, ``.git``, ``.aws``, ``.ssh``,
anything whose name starts with a dot), private keys and key stores (:data:`SECRET_FILE_PATTERNS`),
byte code, virtualenvs (a folder holding ``pyvenv.cfg``), ``node_modules`` and ``site-packages``.
A symlink ships only when it points inside the folder, and a linked folder is not walked. A folder
holding more than :data:`MAX_MODULE_BYTES` fails with its largest files named: data that size
belongs in storage the cluster reads, not in each job's upload.

**The job package.** :func:`build_job_package` makes the one package generated per job,
``raybatch_job``: the spec (``spec.json``) and, with S3 settings shipped, the name under which the
driver finds them in the cluster's store (``s3_settings_uri``; see pipeline/credentials.py). The
spec used to be the entrypoint's argument; Ray runs the entrypoint through ``sh -c``, and one argument
past 128 KiB (the kernel's ``MAX_ARG_STRLEN``: a long system prompt, a large JSON schema) failed
with ``[Errno 7] Argument list too long``. In the package it may be as large as the package store
takes. :func:`read_job_file` is the cluster side's reader of that layout.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.resources
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: Folders never walked: byte-code caches and dependency trees (hidden folders are skipped too).
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
#: Files never shipped, in any folder (names matched lower-cased): private keys, certificates with
#: their keys, key stores, environment and credentials files, cloud service-account keys, anything
#: named as a secret. A legitimate file caught here (``secret_santa.txt``) is better renamed than shipped.
SECRET_FILE_PATTERNS = tuple(
    """
    *.pem *.key *.p12 *.pfx *.jks *.keystore *.ppk *.kdbx *.tfstate *.env id_rsa* id_dsa* id_ecdsa*
    id_ed25519* credentials credentials.* *secret* service-account*.json *service_account*.json
    """.split()
)
#: Most bytes of files one module folder may ship (Ray's package store warns at 256 MiB).
MAX_MODULE_BYTES = 64 * 1024 * 1024
# A fixed timestamp keeps the zip bytes (and so uploads) identical for identical sources.
_ZIP_DATE_TIME = (2020, 1, 1, 0, 0, 0)

#: The generated per-job package, and its files.
JOB_MODULE = "raybatch_job"
SPEC_FILE = "spec.json"
S3_SETTINGS_URI_FILE = "s3_settings_uri"


@dataclass(frozen=True)
class RayPackage:
    """A zipped module ready to upload: ``uri`` goes into ``runtime_env['py_modules']``."""

    uri: str
    data: bytes

    @property
    def name(self) -> str:
        """The package name in the ``/api/packages/gcs/<name>`` endpoint."""
        return self.uri.removeprefix("gcs://")


def _skipped_dir(path: Path) -> bool:
    """Hidden folders, dependency trees and environments (a virtualenv's ``pyvenv.cfg``, conda's
    ``conda-meta``)."""
    return (
        path.name.startswith(".")
        or path.name in _SKIPPED_DIRS
        or (path / "pyvenv.cfg").exists()
        or (path / "conda-meta").is_dir()
    )


def _skipped_name(name: str) -> bool:
    lowered = name.lower()
    return (
        name.startswith(".")
        or name.endswith(_SKIPPED_SUFFIXES)
        or any(fnmatch.fnmatchcase(lowered, pattern) for pattern in SECRET_FILE_PATTERNS)
    )


def _skipped_file(path: Path, root: Path) -> bool:
    if _skipped_name(path.name):
        return True
    if not path.is_symlink():
        return False
    # A link ships what it points at, so the target is judged, not the link's name: one out of the
    # folder (~/.aws/credentials, /etc/...), or to a file or folder left out here (envcopy -> .env).
    target = path.resolve()
    if not target.is_relative_to(root):
        return True
    steps = target.relative_to(root).parts
    return _skipped_name(steps[-1]) or any(
        _skipped_dir(root.joinpath(*steps[: index + 1])) for index in range(len(steps) - 1)
    )


def _too_large(module_path: Path, sizes: list[tuple[int, str]]) -> ValueError:
    largest = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for size, name in sorted(sizes, reverse=True)[:3])
    return ValueError(
        f"{module_path} holds more than {MAX_MODULE_BYTES >> 20} MiB of files to ship with every job "
        f"(largest: {largest}). Keep data out of the module's folder: read it from input_uri or from "
        "storage the cluster reaches, and ship only code and small files such as prompt templates."
    )


def module_files(module_path: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) pairs for a package directory or a single ``.py`` file: what ships."""
    if module_path.is_file():
        return [(module_path.name, module_path)]
    files: list[tuple[str, Path]] = []
    sizes: list[tuple[int, str]] = []
    total = 0
    for folder, dirs, names in os.walk(module_path):  # a linked folder is listed, never entered
        here = Path(folder)
        dirs[:] = sorted(name for name in dirs if not _skipped_dir(here / name))
        for name in sorted(names):
            path = here / name
            if _skipped_file(path, module_path) or not path.is_file():
                continue
            relative = (Path(module_path.name) / path.relative_to(module_path)).as_posix()
            size = path.stat().st_size
            total += size
            sizes.append((size, relative))
            if total > MAX_MODULE_BYTES:  # stop before reading a data folder into memory
                raise _too_large(module_path, sizes)
            files.append((relative, path))
    return sorted(files)


def build_py_module_package(module_path: str | Path) -> RayPackage:
    """Zip a package directory or a ``.py`` file for ``py_modules``; raises if there is nothing to ship."""
    module_path = Path(module_path).resolve()
    if not (module_path.is_dir() or module_path.suffix == ".py"):
        raise ValueError(f"{module_path} is neither a package directory nor a .py file.")
    files = module_files(module_path)
    if not files:
        raise ValueError(f"{module_path} holds no files to ship.")
    return build_package({name: path.read_bytes() for name, path in files})


def build_provider_package(package_path: str | Path) -> RayPackage:
    """Zip the provider's own package for ``py_modules``: every ``.py`` file of it, whatever its name.

    The name filters of :func:`build_py_module_package` are for a DAG author's folders, where a file
    named like a secret may be one. Applied to our own source they left out
    ``pipeline/credentials.py`` (``credentials.*``), which every job's driver imports: on a cluster
    without the provider installed, every job failed at start. Our package holds code only.
    """
    root = Path(package_path).resolve()
    files = {
        (Path(root.name) / path.relative_to(root)).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*.py"))
        if not any(part == "__pycache__" or part.startswith(".") for part in path.relative_to(root).parts)
    }
    if not files:
        raise ValueError(f"{root} holds no Python files to ship.")
    return build_package(files)


def build_package(files: dict[str, bytes]) -> RayPackage:
    """Zip files given by their path inside the zip (e.g. a generated module) into a package."""
    digest = hashlib.sha1()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(files.items()):
            digest.update(name.encode() + b"\0" + data + b"\0")
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return RayPackage(uri=f"gcs://_ray_pkg_{digest.hexdigest()}.zip", data=buffer.getvalue())


def build_job_package(spec_json: str, s3_settings_uri: str | None = None) -> RayPackage:
    """The ``raybatch_job`` package of one job: its spec and, if any, where its S3 settings wait.

    Content-addressed like the others: a retry of the same spec without S3 settings reuses the
    uploaded package; ``s3_settings_uri`` is random per submit (pipeline/credentials.py).
    """
    files = {
        f"{JOB_MODULE}/__init__.py": b'"""The spec of one raybatch job (generated by the operator)."""\n',
        f"{JOB_MODULE}/{SPEC_FILE}": spec_json.encode(),
    }
    if s3_settings_uri is not None:
        files[f"{JOB_MODULE}/{S3_SETTINGS_URI_FILE}"] = s3_settings_uri.encode()
    return build_package(files)


def read_job_file(name: str) -> bytes | None:
    """A file of this job's ``raybatch_job`` package, as the job's processes see it (Ray puts
    ``py_modules`` on their path, unpacked or as a zip); None outside a job or when it has no such file."""
    try:
        package = importlib.resources.files(JOB_MODULE)
    except ModuleNotFoundError:
        return None
    resource = package.joinpath(name)
    return resource.read_bytes() if resource.is_file() else None
