"""Where the OpenAI-compatible Batch API keeps files and batches: one folder in an object store.

Layout under the configured root (``[raybatch] openai_files_uri``)::

    files/<file id>.json            the file object (OpenAI's fields, plus where its bytes are)
    files/<file id>.jsonl           an uploaded file's bytes
    batches/<batch id>.json         the batch record: what was asked, and when it was cancelled
    batches/<batch id>/output/      the batch's run output (manifest.json, versions/...)

The Ray job reads an uploaded file and writes the output folder itself, so the root must be reachable
from the cluster too: a local folder for a single-machine setup, ``s3://...`` otherwise. Paths are
Airflow's :class:`~airflow.sdk.ObjectStoragePath`, so ``openai_files_conn_id`` names the
connection for a remote store.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from airflow.sdk import ObjectStoragePath

#: File object fields that are ours, not OpenAI's: kept in the record, never returned.
_PRIVATE_FIELDS = ("uri",)


class NotFoundError(LookupError):
    """No file or batch with that id."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def public(record: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    return {key: value for key, value in record.items() if key not in _PRIVATE_FIELDS}


def _file_record(
    file_id: str, size: int, filename: str, purpose: str, uri: str
) -> dict[str, Any]:  # Any: JSON values.
    """An OpenAI file object, plus ``uri``: where its bytes are (a file, or a folder of part files)."""
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
        "uri": uri,
    }


class OpenAIStore:
    """Files and batch records of the OpenAI-compatible API, as JSON beside the data."""

    def __init__(self, root: str, conn_id: str | None = None) -> None:
        if "://" not in root:
            root = f"file://{root}"
        self.root = ObjectStoragePath(root, conn_id=conn_id)

    def _path(self, *parts: str) -> ObjectStoragePath:
        path = self.root
        for part in parts:
            if "/" in part or part in ("", ".", ".."):
                raise NotFoundError(part)  # an id from a URL is never a path
            path = path / part
        return path

    @staticmethod
    def uri(path: ObjectStoragePath) -> str:
        """What the Ray job is given: a plain path for local files, ``s3://bucket/key`` otherwise.

        Not ``str(path)``: that names the Airflow connection in the URI (``s3://conn_id@bucket/key``),
        which the cluster knows nothing of.
        """
        return path.path if path.protocol == "file" else f"{path.protocol}://{path.path}"

    def _write_json(self, path: ObjectStoragePath, record: dict[str, Any]) -> None:  # Any: JSON values.
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, sort_keys=True))

    def _read_json(self, path: ObjectStoragePath) -> dict[str, Any]:  # Any: JSON values.
        try:
            return json.loads(path.read_text())
        except FileNotFoundError as err:
            raise NotFoundError(path.name.removesuffix(".json")) from err

    # -- files ------------------------------------------------------------------------------------

    def add_file(self, chunks: Iterator[bytes], filename: str, purpose: str) -> dict[str, Any]:  # Any: JSON.
        """Store an upload's bytes, then its file object (so a listed file always has its bytes)."""
        file_id = new_id("file")
        data = self._path("files", f"{file_id}.jsonl")
        data.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with data.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        record = _file_record(file_id, size, filename, purpose, self.uri(data))
        self._write_json(self._path("files", f"{file_id}.json"), record)
        return record

    def add_output_file(
        self, file_id: str, folder: str, filename: str, size: int
    ) -> dict[str, Any]:  # Any: JSON.
        """A file object for a batch's output or error lines, which the run wrote as part files."""
        record = _file_record(file_id, size, filename, "batch_output", folder)
        self._write_json(self._path("files", f"{file_id}.json"), record)
        return record

    def file(self, file_id: str) -> dict[str, Any]:  # Any: JSON values.
        return self._read_json(self._path("files", f"{file_id}.json"))

    def files(self) -> list[dict[str, Any]]:  # Any: JSON values.
        folder = self._path("files")
        if not folder.exists():
            return []
        return [json.loads(path.read_text()) for path in folder.iterdir() if path.name.endswith(".json")]

    def file_content(self, file_id: str) -> Iterator[bytes]:
        """An upload's bytes, or an output file's part files one after the other (by name)."""
        source = self.path_of(self.file(file_id)["uri"])
        sources = (
            sorted(p for p in source.iterdir() if p.name.endswith(".jsonl")) if source.is_dir() else [source]
        )
        for path in sources:
            with path.open("rb") as data:
                while chunk := data.read(1 << 20):
                    yield chunk

    def path_of(self, uri: str) -> ObjectStoragePath:
        """A path the store wrote (:meth:`uri`), on the store's connection."""
        return ObjectStoragePath(uri if "://" in uri else f"file://{uri}", conn_id=self.root.conn_id)

    def delete_file(self, file_id: str) -> None:
        record = self.file(file_id)
        if record["purpose"] != "batch_output":  # output lines stay with their run's versions
            self.path_of(record["uri"]).unlink(missing_ok=True)
        self._path("files", f"{file_id}.json").unlink()

    # -- batches ------------------------------------------------------------------------------------

    def output_uri(self, batch_id: str) -> str:
        return self.uri(self._path("batches", batch_id, "output"))

    def save_batch(self, record: dict[str, Any]) -> None:  # Any: JSON values.
        self._write_json(self._path("batches", f"{record['id']}.json"), record)

    def delete_batch(self, batch_id: str) -> None:
        self._path("batches", f"{batch_id}.json").unlink(missing_ok=True)

    def batch(self, batch_id: str) -> dict[str, Any]:  # Any: JSON values.
        return self._read_json(self._path("batches", f"{batch_id}.json"))

    def batches(self) -> list[dict[str, Any]]:  # Any: JSON values.
        """Every batch record, newest first."""
        folder = self._path("batches")
        if not folder.exists():
            return []
        records = [json.loads(p.read_text()) for p in folder.iterdir() if p.name.endswith(".json")]
        return sorted(records, key=lambda record: (record["created_at"], record["id"]), reverse=True)

    def read_json(self, uri: str) -> dict[str, Any] | None:  # Any: JSON values.
        """A JSON file the run wrote (its manifest, a staged part's sidecar), or None if absent."""
        path = self.path_of(uri)
        return json.loads(path.read_text()) if path.exists() else None

    def glob(self, uri: str, pattern: str) -> list[str]:
        folder = self.path_of(uri)
        return [self.uri(path) for path in folder.glob(pattern)] if folder.exists() else []

    def size_of(self, uri: str) -> int:
        folder = self.path_of(uri)
        return sum(path.stat().st_size for path in folder.iterdir() if path.name.endswith(".jsonl"))
