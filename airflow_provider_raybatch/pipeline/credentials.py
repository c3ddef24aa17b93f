"""S3 settings shipped with one job: never written to a node's disk, gone from the cluster when it ends.

Why this shape. The settings (keys from ``aws_conn_id``) used to travel as a ``py_modules`` package:
every node unpacked it under Ray's ``runtime_resources/py_modules_files``, and it stayed there after
the job, readable by later jobs, until Ray's 10 GB cache evicted it or the Ray session ended. Ray
has no secret store (a runtime_env's ``env_vars`` show in the dashboard and the job table), but it
has the GCS's internal key-value store, which every process of the cluster reaches and which lives in
the head's memory. So:

1. The operator uploads the settings through the Jobs API's package route under a random name
   (``shared/s3_settings_upload.py``: ``gcs://raybatch_s3_settings_<128 random bits>.json``) and names that
   upload in no runtime_env field, so no node downloads or unpacks it. Its name is written only in
   the job package (``raybatch_job/s3_settings_uri``, shared/packaging.py), which the dashboard does
   not show; the entrypoint, runtime_env and metadata carry neither the name nor the keys.
2. The hook's probe before the upload pins the name for ``RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S``
   (default 600 s). No job references it, so the GCS deletes it when the pin expires: a job that
   never starts leaves nothing after ten minutes, and a job that starts later than that fails with
   a message that says so.
3. The driver (:func:`held_for_this_job`, around the whole run) reads the upload straight from the
   store, copies it under a key of its own (namespace :data:`KV_NAMESPACE`, key ``<job id>/<upload
   name>``: the upload may expire mid-run, and workers need the settings later) and deletes the
   upload. Every other process of the job reads the copy (:func:`shipped_s3_settings`), once, into
   memory. Nothing is written to a file.
4. When the driver ends (returns, raises, or gets the SIGTERM of ``ray job stop``: the handler
   deletes the copy first, then lets Ray's own handler exit), it deletes the copy. After a SIGKILL
   (``ray job stop`` sends one 3 s after its SIGTERM; the OOM killer) the copy stays in the head's
   memory until the next raybatch driver on the cluster sweeps copies of ended jobs, or the cluster
   restarts. It is never on a node's disk.

What this does not change: while a job runs, any code running on the cluster can read the store
(Ray has no access control between jobs; the unpacked files were as readable). With GCS fault
tolerance (an external Redis) the store lives in Redis, and Redis's persistence (RDB/AOF) writes it
to Redis's disk. Ray Data's read tasks carry the pyarrow ``S3FileSystem``, keys included, as task
arguments: Ray keeps those in memory, but an object store under memory pressure spills large objects
to disk (object spilling). The cluster's own role (leaving ``aws_conn_id`` unset) ships nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.packaging import S3_SETTINGS_URI_FILE, read_job_file
from airflow_provider_raybatch.shared.s3_settings_upload import UPLOAD_PREFIX

if TYPE_CHECKING:
    from types import FrameType

#: Where the driver keeps this job's copy in the GCS's internal key-value store.
KV_NAMESPACE = "raybatch_job_s3"
_UPLOAD_URI = re.compile(rf"^{re.escape(UPLOAD_PREFIX)}[0-9a-f]{{32}}\.json$")

log = logging.getLogger("airflow_provider_raybatch.pipeline")
# This process's settings once read (a worker reads the store once), or those its driver holds.
_settings: JsonObject | None = None


class JobCredentialsError(RuntimeError):
    """The job's S3 settings are not where the job package says they wait."""


def _upload_uri() -> str | None:
    """The job's upload name from its job package; None when the job relies on the cluster's own."""
    data = read_job_file(S3_SETTINGS_URI_FILE)
    if data is None:
        return None
    # The driver deletes this key from Ray's own namespace (packages live there): never another one.
    if not _UPLOAD_URI.match(data.decode(errors="replace")):
        raise JobCredentialsError(f"The job package names {data[:80]!r}, which is no S3 settings upload.")
    return data.decode()


def _copy_key(upload_uri: str) -> str:
    import ray

    return f"{ray.get_runtime_context().get_job_id()}/{upload_uri.removeprefix('gcs://')}"


def shipped_s3_settings() -> JsonObject | None:
    """The settings shipped with this job, or None when it relies on the cluster's credentials.

    Read once per process from the driver's copy in the cluster's store (Ray is imported only for a
    job that shipped settings).
    """
    global _settings
    if _settings is not None:
        return dict(_settings)
    upload_uri = _upload_uri()
    if upload_uri is None:
        return None
    from ray.experimental.internal_kv import _internal_kv_get

    data = _internal_kv_get(_copy_key(upload_uri), namespace=KV_NAMESPACE)
    if data is None:
        raise JobCredentialsError(
            "This job's S3 settings (aws_conn_id) are not in the cluster's store: its driver has "
            "ended (they are deleted when it does) or has not taken them yet."
        )
    _settings = json.loads(data)
    return dict(_settings)


@contextlib.contextmanager
def held_for_this_job() -> Iterator[None]:
    """In the driver, around the whole run: take the uploaded settings into this job's own copy,
    and delete that copy when the driver ends, a SIGTERM included (see the module docstring).

    Needs ``ray.init`` first. Does nothing for a job that shipped no settings.
    """
    global _settings
    upload_uri = _upload_uri()
    if upload_uri is None:
        yield
        return
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_put

    data = _internal_kv_get(upload_uri)
    if data is None:
        raise JobCredentialsError(
            "This job's S3 settings (aws_conn_id) are gone from the cluster's store: the job started "
            "more than RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S (default 600 s) after it was "
            "submitted, and the cluster deleted them unread. Run the task again; if jobs wait that "
            "long for the cluster, raise that setting on the head node or give the cluster an IAM role."
        )
    _sweep_copies_of_ended_jobs()
    copy_key = _copy_key(upload_uri)

    def forget() -> None:
        global _settings
        _settings = None
        _internal_kv_del(copy_key, namespace=KV_NAMESPACE)

    restore = _forget_on_sigterm(forget)
    try:
        _internal_kv_put(copy_key, data, namespace=KV_NAMESPACE)
        _internal_kv_del(upload_uri)  # the copy is the only one left
        _settings = json.loads(data)
        yield
    finally:
        restore()
        try:
            forget()
        except Exception as err:  # noqa: BLE001 - never hide the run's own outcome behind this
            log.error(
                "Could not delete this job's S3 settings from the cluster's store (the next job's "
                "driver sweeps them): %s: %s",
                type(err).__name__,
                err,
            )


def _forget_on_sigterm(forget: Callable[[], None]) -> Callable[[], None]:
    """Run ``forget`` first on SIGTERM, then what SIGTERM did before; returns the undo.

    ``ray job stop`` sends SIGTERM and, 3 s later, SIGKILL. Ray's own handler raises SystemExit,
    which would reach the ``finally`` above only after every inner cleanup (Ray Data's executor
    shutting down its actors), possibly past those 3 s; so the copy goes at once.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        return lambda: None
    if previous is None:  # a handler set outside Python: treated as the default
        previous = signal.SIG_DFL

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        try:
            forget()
        finally:
            if callable(previous):
                previous(signum, frame)
            else:  # the default action: die of the signal
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    signal.signal(signal.SIGTERM, on_sigterm)
    return restore


def _sweep_copies_of_ended_jobs() -> None:
    """Delete copies whose driver died without deleting them (SIGKILL); best effort.

    Reads the GCS job table through ``ray._private.state``, Ray's debugging accessor: if a Ray
    release changes it, the sweep is skipped with a warning, and nothing else depends on it.
    """
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_list

    try:
        import ray._private.state

        alive = {job["JobID"] for job in ray._private.state.jobs() if not job["IsDead"]}
        for key in _internal_kv_list("", namespace=KV_NAMESPACE):
            if key.decode().partition("/")[0] not in alive:
                _internal_kv_del(key, namespace=KV_NAMESPACE)
    except Exception as err:  # noqa: BLE001 - a failed sweep must not fail this job
        log.warning("Could not sweep S3 settings left by ended jobs: %s: %s", type(err).__name__, err)
