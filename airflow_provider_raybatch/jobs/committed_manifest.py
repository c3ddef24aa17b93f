"""Read a run's committed ``manifest.json`` from the Airflow side: the result that outlives logs.

The pipeline commits a version by writing ``<output_uri>/manifest.json`` last; that file, not the
driver log, is the run's result. The log is lost when the head restarts (even with GCS fault
tolerance) or the driver's node is scaled away, while the committed output stays. So the operator
reads the manifest here first and the log only when Airflow cannot reach ``output_uri`` (a path on
the cluster's own disk, object storage without credentials here).

A manifest is taken only when it is the committed result of the job asked about: its ``job_id``
(written since this provider version) or, for an older manifest, the run's ``run_key`` and
``spec_fingerprint`` must match. A later run's or another spec's manifest at the same place is
not this job's result.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from airflow_provider_raybatch.shared import local_tree
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.manifest import MANIFEST_FILE_NAME
from airflow_provider_raybatch.shared.run_manifest import COMPLETE_STATUS, ManifestJson, RunManifest

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The most bytes read of a manifest: a real one is a few KiB; past this it is not ours.
MAX_MANIFEST_BYTES = 16 << 20
#: The longest a read may take (an object store that does not answer, a credential lookup that
#: hangs); past it the driver log is read instead.
READ_TIMEOUT_SECONDS = 60.0
#: Keys every committed manifest has (pipeline/run.py); one without them, or with a value of another type
#: in a field a reader decides by (:data:`.DECIDING_FIELDS`), is not a run's manifest.
_REQUIRED_KEYS = ("status", "output_uri", "rows_in", "rows_out", "rows_failed")


@dataclass(frozen=True)
class CommittedManifest:
    """What was found at ``<output_uri>/manifest.json``: the manifest, or why there is none."""

    manifest: JsonObject | None
    why_not: str = ""


def manifest_uri(output_uri: str) -> str:
    """Where a run's committed manifest is."""
    return f"{output_uri.rstrip('/')}/{MANIFEST_FILE_NAME}"


def _path(uri: str, conn_id: str | None) -> Path | Any:  # Any: Airflow's ObjectStoragePath.
    """A local path, or Airflow's own object storage path (fsspec, with the task's connection)."""
    if uri[:7].lower() == "file://":  # any case: "FILE://" is a local path too, read without links
        uri = uri[7:]
    if "://" not in uri:
        return Path(uri)
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri, conn_id=conn_id)


def _read_bytes(uri: str, conn_id: str | None, within: str | None = None) -> bytes | None:
    """The file's first bytes (at most one past the limit), or None when it does not exist. On local
    disk the manifest itself is never read through a link (whoever can write the output could point
    one at a file only Airflow may read): the output folder is taken as named, the file below it
    opened without following one (:func:`..shared.local_tree.open_file`)."""
    path = _path(uri, conn_id)
    if isinstance(path, Path):
        try:
            fd = local_tree.open_file(str(path), str(_path(within, None) if within else path.parent))
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read(MAX_MANIFEST_BYTES + 1)
    if not path.is_file():
        return None
    with path.open("rb") as file:
        return file.read(MAX_MANIFEST_BYTES + 1)


def _bounded(call: Callable[[], T]) -> T:
    """Run ``call`` for at most :data:`READ_TIMEOUT_SECONDS`; a call that hangs is left behind.

    :raises TimeoutError: it did not return in time.
    """
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raybatch-manifest")
    try:
        return executor.submit(call).result(timeout=READ_TIMEOUT_SECONDS)
    except FutureTimeout as err:
        raise TimeoutError(f"no answer within {READ_TIMEOUT_SECONDS:.0f} s") from err
    finally:
        executor.shutdown(wait=False)


def read_committed_manifest(
    output_uri: str, conn_id: str | None = None, within: str | None = None
) -> CommittedManifest:
    """The manifest committed at ``output_uri``, or the reason it cannot be had from here.

    Never raises: any failure (no such file, no filesystem for the scheme here, no credentials,
    not JSON, too big, no answer in time) is a reason, and the caller falls back to the driver log.

    :param within: the output folder ``output_uri`` lies under (a dry run's folder is in it): on local
        disk no link below it is followed; unset, ``output_uri`` itself.
    """
    uri = manifest_uri(output_uri)
    try:
        data = _bounded(lambda: _read_bytes(uri, conn_id, within))
    except TimeoutError:
        return CommittedManifest(None, f"{uri} did not answer within {READ_TIMEOUT_SECONDS:.0f} s")
    except Exception as err:  # noqa: BLE001 - a reason to fall back, whatever the filesystem raised.
        return CommittedManifest(None, f"{uri} cannot be read from Airflow ({type(err).__name__}: {err})")
    if data is None:
        return CommittedManifest(None, f"{uri} does not exist where Airflow looks")
    if len(data) > MAX_MANIFEST_BYTES:
        return CommittedManifest(None, f"{uri} is over {MAX_MANIFEST_BYTES} bytes: not a run manifest")
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return CommittedManifest(None, f"{uri} is not JSON ({err})")
    if not isinstance(manifest, dict) or any(key not in manifest for key in _REQUIRED_KEYS):
        return CommittedManifest(None, f"{uri} is not a run manifest (keys {', '.join(_REQUIRED_KEYS)})")
    try:
        RunManifest.of(manifest)
    except ValidationError as err:
        return CommittedManifest(
            None, f"{uri} is not a run manifest ({err.error_count()} values of a wrong type)"
        )
    return CommittedManifest(manifest)


def exists(uri: str, conn_id: str | None = None) -> bool | None:
    """Whether a file or folder exists, as Airflow sees it; None when it cannot tell."""
    try:
        return bool(_bounded(lambda: _path(uri, conn_id).exists()))
    except Exception:  # noqa: BLE001 - cannot tell, whatever the filesystem raised.
        return None


def is_result_of(manifest: ManifestJson, job_id: str, run_key: str, fingerprint: str) -> bool:
    """Whether a committed manifest is the result of Ray job ``job_id`` (see the module docstring)."""
    committed = RunManifest.of(manifest)
    if committed.status != COMPLETE_STATUS:
        return False
    if committed.job_id is not None:
        return committed.job_id == job_id
    return committed.run_key == run_key and committed.spec_fingerprint == fingerprint
