"""Zip local code into the content-addressed packages Ray's ``runtime_env`` ``py_modules`` expects.

Ray's own SDK does this through ``ray._private``; we talk to the Jobs REST API without Ray
installed, so we build the same layout: a package directory is zipped with its own name as the
top-level folder, a single-file module at the zip's root, and the URI is
``gcs://_ray_pkg_<hash>.zip`` where the hash covers every file's relative path and bytes.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

_SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".ruff_cache", ".mypy_cache"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
# A fixed timestamp keeps the zip bytes (and so uploads) identical for identical sources.
_ZIP_DATE_TIME = (2020, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class RayPackage:
    """A zipped module ready to upload: ``uri`` goes into ``runtime_env['py_modules']``."""

    uri: str
    data: bytes

    @property
    def name(self) -> str:
        """The package name in the ``/api/packages/gcs/<name>`` endpoint."""
        return self.uri.removeprefix("gcs://")


def _files_of(module_path: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) pairs for a package directory or a single ``.py`` file."""
    if module_path.is_file():
        return [(module_path.name, module_path)]
    files = []
    for path in sorted(module_path.rglob("*")):
        relative = path.relative_to(module_path)
        if any(part in _SKIPPED_DIRS for part in relative.parts) or path.suffix in _SKIPPED_SUFFIXES:
            continue
        if path.is_file():
            files.append(((Path(module_path.name) / relative).as_posix(), path))
    return files


def build_py_module_package(module_path: str | Path) -> RayPackage:
    """Zip a package directory or a ``.py`` file for ``py_modules``; raises if there is nothing to ship."""
    module_path = Path(module_path).resolve()
    if not (module_path.is_dir() or module_path.suffix == ".py"):
        raise ValueError(f"{module_path} is neither a package directory nor a .py file.")
    files = _files_of(module_path)
    if not files:
        raise ValueError(f"{module_path} holds no files to ship.")
    return build_package({name: path.read_bytes() for name, path in files})


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
