"""Where the OpenAI-compatible Batch API keeps files and batches: one folder in an object store.

Layout under the configured root (``[raybatch] openai_files_uri``)::

    files/<file id>.json            the file object (OpenAI's fields and its owner)
    files/<file id>.jsonl           an uploaded file's bytes
    batches/<batch id>.json         the batch record: what was asked, by whom, when it was cancelled
    batches/<batch id>/output/      the batch's run output (manifest.json, versions/...)
    owners/<owner key>/<id>         an empty marker per file and batch of one owner, so that a user's
                                    listing reads their own records only (not everyone's)
    owners/<owner key>/reserved/<ns>-<id>
                                    an empty marker per request that is creating a file or batch of that
                                    owner: what makes their quotas hold under concurrent requests (quota.py)

The Ray job reads an uploaded file and writes the output folder itself, so the root must be reachable
from the cluster too: a local folder for a single-machine setup, ``s3://...`` otherwise. Paths are
Airflow's :class:`~airflow.sdk.ObjectStoragePath`, so ``openai_files_conn_id`` names the
connection for a remote store.

Every id from a request is checked against the exact shape this store issues before it becomes
part of a path (``file-<32 hex>``, ``file-<32 hex>-output|errors``, ``batch_<32 hex>``), and no path
is ever read from a record: an upload's bytes are always ``files/<id>.jsonl``, and a batch's output
files are the folders its committed ``manifest.json`` names, accepted only inside that batch's own
output folder. (A record's path once was trusted: ``<id>.jsonl%3FversionId%3D`` made s3fs read an
upload as a record whose ``uri`` pointed anywhere.) Output file records are derived on read from
the batch and its manifest, so reading never writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk import ObjectStoragePath

from airflow_provider_raybatch.jobs.committed_manifest import MAX_MANIFEST_BYTES
from airflow_provider_raybatch.openai_api import run_output
from airflow_provider_raybatch.openai_api.quota import Reservation, Usage
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.local_tree import LinkInOutputError

log = logging.getLogger(__name__)

#: The shapes of the ids this store issues; anything else is no file or batch of ours.
FILE_ID = re.compile(r"file-[0-9a-f]{32}")
OUTPUT_FILE_ID = re.compile(r"file-(?P<batch>[0-9a-f]{32})-(?P<kind>output|errors)")
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
#: Record fields that are ours, not OpenAI's: kept in the record, never returned.
_PRIVATE_FIELDS = ("uri", "owner", "owner_name", "deleted_files")
_OUTPUT_KINDS = {"output": ("outputs_uri", "completed"), "errors": ("errors_uri", "failed")}
#: The largest staged part's sidecar read: the pipeline's own bound (pipeline/sidecars.py's
#: MAX_SIDECAR_BYTES; the Airflow side may not import the pipeline). Ours are kilobytes.
MAX_SIDECAR_BYTES = 16 << 20


class NotFoundError(LookupError):
    """No file or batch with that id (or one whose id is not a shape we issue)."""


class TooLargeError(ValueError):
    """An upload over the configured limit; nothing of it is kept."""


def new_id(prefix: str) -> str:
    """``file-<hex>``, or ``batch_<hex>`` (a batch id is also the DAG run id: no dashes there)."""
    return f"file-{uuid.uuid4().hex}" if prefix == "file" else f"batch_{uuid.uuid4().hex}"


def public(record: JsonObject) -> JsonObject:
    return {key: value for key, value in record.items() if key not in _PRIVATE_FIELDS}


def _file_record(
    file_id: str,
    size: int,
    filename: str,
    purpose: str,
    owner: str | None,
    owner_name: str | None,
    created_at: int | None = None,
) -> JsonObject:
    """An OpenAI file object, plus who uploaded it (its owner)."""
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()) if created_at is None else created_at,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
        "owner": owner,
        "owner_name": owner_name,
    }


def owner_key(owner: str) -> str:
    """The folder name of an owner's markers: a digest, so any user id makes a safe path segment."""
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


def _names(folder: ObjectStoragePath) -> list[str]:
    """The names in ``folder``, fresh from the store (s3fs would answer from its listing cache, which
    another request's upload or delete has made stale); none when it does not exist (an S3 prefix
    whose last object was just deleted is gone)."""
    try:
        entries = folder.fs.ls(folder.path, detail=False, refresh=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]


def _checked(pattern: re.Pattern[str], object_id: str) -> str:
    if not isinstance(object_id, str) or not pattern.fullmatch(object_id):
        raise NotFoundError(object_id)
    return object_id


class OpenAIStore:
    """Files and batch records of the OpenAI-compatible API, as JSON beside the data."""

    def __init__(self, root: str, conn_id: str | None = None) -> None:
        if "://" not in root:
            root = f"file://{root}"
        self.root = ObjectStoragePath(root, conn_id=conn_id)

    @staticmethod
    def uri(path: ObjectStoragePath) -> str:
        """What the Ray job is given: a plain path for local files, ``s3://bucket/key`` otherwise.

        Not ``str(path)``: that names the Airflow connection in the URI (``s3://conn_id@bucket/key``),
        which the cluster knows nothing of.
        """
        return path.path if path.protocol == "file" else f"{path.protocol}://{path.path}"

    def _write_json(self, path: ObjectStoragePath, record: JsonObject) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, sort_keys=True))

    def _read_json(self, path: ObjectStoragePath, object_id: str) -> JsonObject:
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise NotFoundError(object_id) from err
        if not isinstance(record, dict) or record.get("id") != object_id:
            raise NotFoundError(object_id)  # not a record this store wrote for that id
        return record

    def _inside(self, uri: str, folder: ObjectStoragePath) -> ObjectStoragePath:
        """``uri`` as a path, if it lies under ``folder`` (a run's output folder); else NotFoundError.

        Text only, no resolution: ``..``, query strings, fragments and NULs are refused outright.
        """
        base = self.uri(folder).rstrip("/") + "/"
        parts = uri.removeprefix(base).split("/")
        if not uri.startswith(base) or any(part in ("", ".", "..") for part in parts):
            raise NotFoundError(uri)
        if any(char in uri for char in "?#\x00\\"):
            raise NotFoundError(uri)
        return ObjectStoragePath(uri if "://" in uri else f"file://{uri}", conn_id=self.root.conn_id)

    # -- files ------------------------------------------------------------------------------------

    def upload_path(self, file_id: str) -> ObjectStoragePath:
        """Where an upload's bytes are: ``files/<id>.jsonl``, derived from the checked id."""
        return self.root / "files" / f"{_checked(FILE_ID, file_id)}.jsonl"

    def upload_uri(self, file_id: str) -> str:
        """An upload's bytes as the Ray job reads them (the batch DAG's input)."""
        return self.uri(self.upload_path(file_id))

    def add_file(
        self,
        chunks: Iterator[bytes],
        filename: str,
        purpose: str,
        *,
        owner: str | None = None,
        owner_name: str | None = None,
        max_bytes: int | None = None,
        file_id: str | None = None,
    ) -> JsonObject:
        """Store an upload's bytes, then its file object (so a listed file always has its bytes).

        ``file_id``: the id its quota reservation was made for; a new one when None.
        Raises TooLargeError past ``max_bytes``, having removed what was written.
        """
        file_id = new_id("file") if file_id is None else _checked(FILE_ID, file_id)
        data = self.upload_path(file_id)
        data.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        try:
            with data.open("wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise TooLargeError(f"The file is over the {max_bytes}-byte upload limit.")
                    out.write(chunk)
        except BaseException:
            data.unlink(missing_ok=True)
            raise
        record = _file_record(file_id, size, filename, purpose, owner, owner_name)
        self._write_json(self.root / "files" / f"{file_id}.json", record)
        self._mark(owner, file_id)
        return record

    def _mark(self, owner: str | None, object_id: str) -> None:
        if owner is not None:
            marker = self.root / "owners" / owner_key(owner) / object_id
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_bytes(b"")

    def _owned_ids(self, owner: str, pattern: re.Pattern[str]) -> list[str]:
        return [name for name in _names(self.root / "owners" / owner_key(owner)) if pattern.fullmatch(name)]

    def count_files(self, owner: str) -> int:
        """How many uploads ``owner`` has (their quota's measure)."""
        return len(self._owned_ids(owner, FILE_ID))

    def file_usage(self, owner: str) -> Usage:
        """``owner``'s uploads and the reservations of uploads under way, for their quota (quota.py)."""
        reservations = self.reservations(owner, FILE_ID)  # first: see reservations()
        uploads = frozenset(self._owned_ids(owner, FILE_ID))
        return Usage(counted=uploads, existing=uploads, reservations=reservations)

    # -- quota reservations (quota.py) --------------------------------------------------------------

    def _reserved_folder(self, owner: str) -> ObjectStoragePath:
        return self.root / "owners" / owner_key(owner) / "reserved"

    @contextmanager
    def reserved(self, owner: str, object_id: str) -> Iterator[Reservation]:
        """A reservation of one unit of ``owner``'s quota for ``object_id``, written on entering and
        removed on leaving, whether the object was kept or not (once kept, its owner marker counts it)."""
        folder = self._reserved_folder(owner)
        folder.mkdir(parents=True, exist_ok=True)
        # The time is read right before the write: the shorter that gap, the rarer the ranking's gap
        # that the quota's verification closes (quota.py, step 4).
        reservation = Reservation(time.time_ns(), object_id)
        (folder / reservation.name).write_bytes(b"")
        try:
            yield reservation
        finally:
            (folder / reservation.name).unlink(missing_ok=True)

    def reservations(self, owner: str, pattern: re.Pattern[str]) -> frozenset[Reservation]:
        """``owner``'s live reservations of objects of ``pattern``; an expired one (its request died) is
        removed. Read before the objects they are for: a request that writes its object and releases
        its reservation between the two listings is then seen in one of them, never in neither."""
        now_ns = time.time_ns()
        folder = self._reserved_folder(owner)
        live = set()
        for name in _names(folder):
            reservation = Reservation.parse(name)
            if reservation is None or not pattern.fullmatch(reservation.object_id):
                continue
            if reservation.expired(now_ns):
                (folder / name).unlink(missing_ok=True)
            else:
                live.add(reservation)
        return frozenset(live)

    def file(self, file_id: str) -> JsonObject:
        """An upload's file object, or a batch's output or error file derived from its manifest."""
        match = OUTPUT_FILE_ID.fullmatch(file_id) if isinstance(file_id, str) else None
        if match is not None:
            return self._output_file(file_id, f"batch_{match['batch']}", match["kind"])[0]
        return self._read_json(self.root / "files" / f"{_checked(FILE_ID, file_id)}.json", file_id)

    def _output_file(self, file_id: str, batch_id: str, kind: str) -> tuple[JsonObject, ObjectStoragePath]:
        """An output or error file of a completed batch, and the folder of part files it is."""
        batch = self.batch(batch_id)
        if file_id in batch.get("deleted_files", ()):
            raise NotFoundError(file_id)
        output = self.output_path(batch_id)
        manifest = self.read_json(self.uri(output / "manifest.json"))
        uri_key, count_key = _OUTPUT_KINDS[kind]
        if manifest is None or not int((manifest.get("request_counts") or {}).get(count_key) or 0):
            raise NotFoundError(file_id)
        folder = self._inside(str(manifest.get(uri_key)), output)
        try:
            size = sum(
                run_output.size(path, output) for path in run_output.files_in(folder, output, ".jsonl")
            )
        except LinkInOutputError as err:
            log.warning("The %s file of %s is not served: %s", kind, batch_id, err)
            raise NotFoundError(file_id) from err
        record = _file_record(
            file_id,
            size,
            f"{batch_id}_{kind}.jsonl",
            "batch_output",
            batch.get("owner"),
            batch.get("owner_name"),
            created_at=batch["created_at"],
        )
        return record, folder

    def output_file_id(self, batch_id: str, kind: str) -> str:
        return f"file-{_checked(BATCH_ID, batch_id).removeprefix('batch_')}-{kind}"

    def files(self, owner: str | None = None) -> list[JsonObject]:
        """The uploads, and the output and error files of completed batches: ``owner``'s, or everyone's
        (None). A record deleted while the listing runs is left out, never an error."""
        if owner is not None:
            upload_ids = self._owned_ids(owner, FILE_ID)
        else:
            names = _names(self.root / "files")
            upload_ids = [name.removesuffix(".json") for name in names if name.endswith(".json")]
        file_ids = [file_id for file_id in upload_ids if FILE_ID.fullmatch(file_id)]
        file_ids += [
            self.output_file_id(batch["id"], kind) for batch in self.batches(owner) for kind in _OUTPUT_KINDS
        ]
        records = []
        for file_id in file_ids:
            try:
                records.append(self.file(file_id))
            except (NotFoundError, ValueError):
                continue  # deleted meanwhile, no output of that kind, or half written
        return records

    def file_content(self, file_id: str) -> Iterator[bytes]:
        """An upload's bytes, or an output file's part files one after the other (by name)."""
        match = OUTPUT_FILE_ID.fullmatch(file_id) if isinstance(file_id, str) else None
        if match is None:
            with self.upload_path(file_id).open("rb") as data:
                while chunk := data.read(1 << 20):
                    yield chunk
            return
        batch_id = f"batch_{match['batch']}"
        folder = self._output_file(file_id, batch_id, match["kind"])[1]
        output = self.output_path(batch_id)
        for path in run_output.files_in(folder, output, ".jsonl"):
            yield from run_output.chunks(path, output)

    def delete_file(self, file_id: str) -> None:
        """An upload goes with its bytes; an output file is only hidden (its lines stay with the
        run's committed version, which the batch DAG's outputs still name)."""
        record = self.file(file_id)
        if record["purpose"] == "batch_output":
            batch_id = f"batch_{file_id.split('-')[1]}"
            batch = self.batch(batch_id)
            self.save_batch({**batch, "deleted_files": [*batch.get("deleted_files", ()), file_id]})
            return
        self.upload_path(file_id).unlink(missing_ok=True)
        (self.root / "files" / f"{file_id}.json").unlink(missing_ok=True)
        if record.get("owner") is not None:
            (self.root / "owners" / owner_key(record["owner"]) / file_id).unlink(missing_ok=True)

    # -- batches ------------------------------------------------------------------------------------

    def output_path(self, batch_id: str) -> ObjectStoragePath:
        return self.root / "batches" / _checked(BATCH_ID, batch_id) / "output"

    def output_uri(self, batch_id: str) -> str:
        """Where the batch's run writes (the batch DAG's output), derived from the checked id."""
        return self.uri(self.output_path(batch_id))

    def save_batch(self, record: JsonObject) -> None:
        self._write_json(self.root / "batches" / f"{_checked(BATCH_ID, record['id'])}.json", record)
        self._mark(record.get("owner"), record["id"])

    def delete_batch(self, batch_id: str) -> None:
        path = self.root / "batches" / f"{_checked(BATCH_ID, batch_id)}.json"
        try:
            owner = self.batch(batch_id).get("owner")
        except (NotFoundError, ValueError):
            owner = None
        path.unlink(missing_ok=True)
        if owner is not None:
            (self.root / "owners" / owner_key(owner) / batch_id).unlink(missing_ok=True)

    def batch(self, batch_id: str) -> JsonObject:
        return self._read_json(self.root / "batches" / f"{_checked(BATCH_ID, batch_id)}.json", batch_id)

    def batches(self, owner: str | None = None) -> list[JsonObject]:
        """``owner``'s batch records, or everyone's (None), newest first."""
        if owner is not None:
            batch_ids = self._owned_ids(owner, BATCH_ID)
        else:
            batch_ids = [
                name.removesuffix(".json") for name in _names(self.root / "batches") if name.endswith(".json")
            ]
        records = []
        for batch_id in batch_ids:
            if BATCH_ID.fullmatch(batch_id):
                try:
                    records.append(self.batch(batch_id))
                except (NotFoundError, ValueError):
                    continue  # a foreign, half-written or just deleted file is no batch of ours
        return sorted(records, key=lambda record: (record["created_at"], record["id"]), reverse=True)

    def _run_output_of(self, uri: str) -> ObjectStoragePath | None:
        """The output folder of the batch whose run output ``uri`` lies in, if it does."""
        batches = self.uri(self.root / "batches").rstrip("/") + "/"
        batch_id = uri.removeprefix(batches).split("/", 1)[0] if uri.startswith(batches) else ""
        return self.output_path(batch_id) if BATCH_ID.fullmatch(batch_id) else None

    def read_json(
        self, uri: str, max_bytes: int = MAX_MANIFEST_BYTES, what: str = "manifest"
    ) -> JsonObject | None:
        """A JSON file a batch's run wrote in its output folder (its manifest, a staged part's sidecar),
        or None if absent, not ours, outside a batch's output folder, or over ``max_bytes`` (logged).
        On local disk no link below the output folder is followed (:mod:`.run_output`)."""
        output = self._run_output_of(uri)
        try:
            path = None if output is None else self._inside(uri, output)
        except NotFoundError:
            path = None
        data = (
            None if output is None or path is None else run_output.read_bounded(path, output, max_bytes, what)
        )
        try:
            value = None if data is None else json.loads(data)
        except ValueError:
            return None  # half written, or not ours
        return value if isinstance(value, dict) else None

    def staged_sidecars(self, batch_id: str) -> list[JsonObject]:
        """The sidecars of the parts a running batch has staged (pipeline/stage/parts.py), each read
        up to :data:`MAX_SIDECAR_BYTES` (one over it is left out, and logged)."""
        output = self.output_path(batch_id)
        return [
            record
            for path in run_output.sidecar_files(output / "_staging", output)
            if (record := self.read_json(self.uri(path), MAX_SIDECAR_BYTES, "sidecar"))
        ]
