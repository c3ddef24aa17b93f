"""Where a batch's files go, on local disk or S3, through pyarrow's filesystems (as Ray Data uses).

Layout under ``output_uri``::

    outputs/   the generated rows (Parquet or JSONL files written by Ray Data)
    errors/    the rows that failed, with the reason
    manifest.json  written last: its presence means the folder holds one complete run
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.manifest import MANIFEST_FILE_NAME
from airflow_provider_raybatch.specs import InputFormat, OutputFormat, infer_input_format

if TYPE_CHECKING:
    from ray.data import Dataset

_FORMAT_EXTENSIONS: dict[str, list[str]] = {
    "jsonl": ["jsonl", "ndjson", "json"],
    "csv": ["csv"],
    "parquet": ["parquet", "pq"],
}


@dataclass(frozen=True)
class OutputLayout:
    output_uri: str
    output_format: OutputFormat

    def _join(self, name: str) -> str:
        return self.output_uri.rstrip("/") + "/" + name

    @property
    def outputs_uri(self) -> str:
        return self._join("outputs")

    @property
    def errors_uri(self) -> str:
        return self._join("errors")

    @property
    def manifest_uri(self) -> str:
        return self._join(MANIFEST_FILE_NAME)


def _filesystem(uri: str) -> tuple[Any, str]:  # Any: pyarrow.fs.FileSystem.
    from pyarrow import fs

    if "://" not in uri:
        return fs.LocalFileSystem(), posixpath.abspath(uri)
    return fs.FileSystem.from_uri(uri)


def extensions_for(input_uri: str, input_format: InputFormat) -> list[str] | None:
    """File extensions to read from a folder; None for a single file (read whatever its name)."""
    try:
        infer_input_format(input_uri)
    except ValueError:
        return _FORMAT_EXTENSIONS[input_format]
    return None


def relative_name(path: str, input_uri: str) -> str:
    """A file's name relative to the input folder (its base name when the input is one file)."""
    base = input_uri.split("://", 1)[-1].rstrip("/")
    path = path.split("://", 1)[-1]
    if "://" not in input_uri:
        base = posixpath.abspath(base)
        path = posixpath.abspath(path)
    if path == base or not path.startswith(base + "/"):
        return posixpath.basename(path)
    return path[len(base) + 1 :]


def check_model_source(model: str) -> None:
    """Fail before any engine starts when a local model folder is missing or holds no config.json.

    Otherwise vLLM's own error surfaces minutes later from inside an actor, after retries.
    Hub ids and s3:// sources are left to vLLM.
    """
    if "://" in model or not (model.startswith(("/", "./", "../", "~")) or posixpath.exists(model)):
        return
    path = posixpath.expanduser(model)
    if not posixpath.isdir(path):
        raise FileNotFoundError(f"model={model!r}: no such folder on the Ray cluster's driver node.")
    if not posixpath.exists(posixpath.join(path, "config.json")):
        raise FileNotFoundError(f"model={model!r}: folder has no config.json, so it is not a model folder.")


def clear_previous_run(layout: OutputLayout) -> None:
    """Remove an earlier run's files, manifest first, so a reader never sees old and new mixed."""
    from pyarrow import fs

    filesystem, manifest_path = _filesystem(layout.manifest_uri)
    if filesystem.get_file_info(manifest_path).type != fs.FileType.NotFound:
        filesystem.delete_file(manifest_path)
    for uri in (layout.outputs_uri, layout.errors_uri):
        filesystem, path = _filesystem(uri)
        if filesystem.get_file_info(path).type == fs.FileType.Directory:
            filesystem.delete_dir(path)


def write_dataset(dataset: Dataset, uri: str, output_format: OutputFormat) -> None:
    """Write a dataset as files under ``uri``; the folder exists afterwards even when it is empty."""
    filesystem, path = _filesystem(uri)
    filesystem.create_dir(path, recursive=True)
    if dataset.count() == 0:
        return
    if output_format == "parquet":
        dataset.write_parquet(uri)
    else:
        dataset.write_json(uri)  # one JSON object per line


def write_text(uri: str, text: str) -> None:
    filesystem, path = _filesystem(uri)
    filesystem.create_dir(posixpath.dirname(path), recursive=True)
    with filesystem.open_output_stream(path) as stream:
        stream.write(text.encode())


def read_text(uri: str) -> str:
    filesystem, path = _filesystem(uri)
    with filesystem.open_input_stream(path) as stream:
        return stream.read().decode()
