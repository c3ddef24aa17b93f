"""On the local Ray cluster: S3 keys shipped with a job
(``aws_conn_id``) must never be on a node's disk, and must leave the cluster when the job ends.

Before, they travelled as a ``py_modules`` package that every node unpacked under the Ray session
folder (``runtime_resources/py_modules_files/.../raybatch_job_credentials/s3.json``), where they stayed
after the job, readable by later jobs. Here a job is stopped mid-run (``ray job stop``: SIGTERM),
and a driver takes, serves to a worker and deletes the settings, while the session folder is searched
for the secret key's bytes and the cluster's key-value store for any copy. The end-to-end run of a
whole DAG with S3 settings, searched the same way during and after, is in
tests/integration/test_s3_and_secrets.py (it uses :func:`files_holding` and :func:`cluster_store`).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.pipeline.credentials import KV_NAMESPACE, UPLOAD_PREFIX
from tests.conftest import (
    CPU_REPLICA,
    RAY_PYTHON,
    REPLICA_SLOT,
    ROOT,
    LocalRayCluster,
    S3Server,
    replica_slots_held,
    submit_pipeline,
    wait_for_job,
)
from tests.unit.pipeline.ray_env import last_printed_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# What the driver scripts below print, as their last line: the store's raybatch keys and the session
# folder. ``wait_for_copy``: first wait (up to 120 s) until some job's driver holds a copy.
_STORE = """
import json, sys, time
import ray
from ray.experimental import internal_kv as kv
ray.init(address=sys.argv[1], logging_level="ERROR")
def keys():
    return {
        "copies": sorted(k.decode() for k in kv._internal_kv_list("", namespace=NAMESPACE)),
        "uploads": sorted(k.decode() for k in kv._internal_kv_list(UPLOAD_PREFIX)),
    }
deadline = time.monotonic() + 120
while WAIT_FOR_COPY and not keys()["copies"] and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps({**keys(), "session_dir": ray._private.worker._global_node.get_session_dir_path()}))
"""


def _run_driver(cluster: LocalRayCluster, code: str, *args: str) -> Any:  # Any: printed JSON.
    """Run ``code`` as a Ray driver connected to the local cluster (its address is ``sys.argv[1]``,
    ``args`` follow); return its last printed line, parsed."""
    env = {
        **cluster.env,
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(cluster.state_dir / "auth_token"),
    }
    address = f"127.0.0.1:{cluster.env['RAYBATCH_GCS_PORT']}"
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code, address, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return last_printed_json(result.stdout)


def cluster_store(cluster: LocalRayCluster, wait_for_copy: bool = False) -> dict[str, Any]:  # Any: JSON.
    """The S3-settings keys in the cluster's key-value store (drivers' copies, pending uploads) and the
    Ray session folder, read by a driver connected to the cluster."""
    header = (
        f"NAMESPACE = {KV_NAMESPACE!r}\nUPLOAD_PREFIX = {UPLOAD_PREFIX!r}\nWAIT_FOR_COPY = {wait_for_copy}\n"
    )
    return _run_driver(cluster, header + _STORE)


def files_holding(root: Path, secret: str) -> list[str]:
    """Every regular file under ``root`` whose bytes contain ``secret``."""
    needle = secret.encode()
    hits = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue  # sockets, links (session_latest), files gone meanwhile
            try:
                if needle in path.read_bytes():
                    hits.append(str(path.relative_to(root)))
            except OSError:
                continue
    return hits


class DiskWatch:
    """Searches every file of the Ray session folder for a secret every few seconds, in a thread,
    while the job runs (the files of a running job come and go: one search at the end is not enough)."""

    def __init__(self, session: Path, secret: str, interval_seconds: float = 3.0) -> None:
        self.session, self.secret, self.interval_seconds = session, secret, interval_seconds
        self.hits: set[str] = set()
        self.searches = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(self.interval_seconds):
            self.hits.update(files_holding(self.session, self.secret))
            self.searches += 1

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()


@pytest.mark.cold_engine  # holds every replica slot: no warm pool may hold one (they run first)
def test_a_job_stopped_mid_run_leaves_its_s3_keys_neither_on_disk_nor_in_the_store(
    ray_connection: LocalRayCluster,
    s3_server: S3Server,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.integration.test_pipeline_job import make_operator

    client = s3_server.client()
    client.create_bucket(Bucket="raybatch-stop")
    rows = "".join(json.dumps({"id": i, "text": f"ticket {i}"}) + "\n" for i in range(20))
    client.put_object(Bucket="raybatch-stop", Key="in/tickets.jsonl", Body=rows.encode())
    monkeypatch.setenv("AIRFLOW_CONN_AWS_STOP_TEST", s3_server.connection_json())
    operator = make_operator(
        tiny_model,
        "s3://raybatch-stop/in/tickets.jsonl",
        str(tmp_path / "out"),
        aws_conn_id="aws_stop_test",
        messages_column=None,
        user_template="Classify: {text}",
        id_column="id",
        keep_columns=None,
        # Its engine waits for a slot the test holds: the job runs until the test stops it.
        replica_resources={**CPU_REPLICA, REPLICA_SLOT: 1},
    )
    hook = RayHook()
    with replica_slots_held(hook):
        job_id = submit_pipeline(
            operator, run_key="stop", submission_id=f"raybatch-stop-{uuid.uuid4().hex[:8]}"
        )
        try:
            # While it runs: its driver holds its own copy (the upload is gone), and no file has the key.
            held = cluster_store(ray_connection, wait_for_copy=True)
            session = Path(held["session_dir"])
            assert hook.get_job_status(job_id) == JobStatus.RUNNING, hook.get_job_log_tail(job_id)
            assert len(held["copies"]) == 1 and held["uploads"] == [], held
            assert files_holding(session, s3_server.secret_key) == []
        finally:
            hook.stop_job(job_id)
        assert wait_for_job(job_id, timeout=120) == JobStatus.STOPPED

    after = cluster_store(ray_connection)
    assert (after["copies"], after["uploads"]) == ([], []), after
    assert files_holding(session, s3_server.secret_key) == []
    assert s3_server.secret_key not in hook.get_job_logs(job_id)


_DRIVER = """
import json, pathlib, sys
import ray
from ray.experimental import internal_kv as kv
from airflow_provider_raybatch.pipeline import credentials
from airflow_provider_raybatch.shared.s3_settings_upload import settings_upload

JOB_DIR = pathlib.Path(sys.argv[2])
SETTINGS = {"endpoint_url": "http://127.0.0.1:9", "region": "r1", "access_key": "AK", "secret_key": SECRET}
upload = settings_upload(SETTINGS)
(JOB_DIR / "raybatch_job" / "s3_settings_uri").write_text(upload.uri)
sys.path.insert(0, str(JOB_DIR))
py_modules = [str(JOB_DIR / "raybatch_job"), PROVIDER]
ray.init(address=sys.argv[1], logging_level="ERROR", runtime_env={"py_modules": py_modules})
kv._internal_kv_put(upload.uri, upload.data)  # as the Jobs API's package route stores it
stale = "ffffffff/raybatch_s3_settings_left_by_a_killed_driver.json"  # a job id that never ran
kv._internal_kv_put(stale, b"{}", namespace=credentials.KV_NAMESPACE)

@ray.remote
def worker_settings():
    from airflow_provider_raybatch.pipeline import storage
    return credentials.shipped_s3_settings(), storage.s3_options().secret_key == SECRET

def copies():
    return sorted(key.decode() for key in kv._internal_kv_list("", namespace=credentials.KV_NAMESPACE))

report = {}
with credentials.held_for_this_job():
    report["during"] = copies()
    report["upload_during"] = kv._internal_kv_exists(upload.uri)
    report["worker"] = ray.get(worker_settings.remote())
report["after"] = copies()
report["job_id"] = ray.get_runtime_context().get_job_id()

# A job that starts after the cluster deleted its unread upload (the pin's expiry) says so.
(JOB_DIR / "raybatch_job" / "s3_settings_uri").write_text(settings_upload(SETTINGS).uri)
try:
    with credentials.held_for_this_job():
        pass
except credentials.JobCredentialsError as err:
    report["expired"] = str(err)
print(json.dumps(report))
"""


def test_a_driver_serves_its_workers_then_deletes_its_copy_and_sweeps_those_of_dead_drivers(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    secret = f"driver/Secret/{uuid.uuid4().hex}"
    (tmp_path / "job" / "raybatch_job").mkdir(parents=True)
    (tmp_path / "job" / "raybatch_job" / "__init__.py").write_text("")
    provider = str(ROOT / "airflow_provider_raybatch")

    report = _run_driver(
        ray_cluster, f"SECRET = {secret!r}\nPROVIDER = {provider!r}\n{_DRIVER}", str(tmp_path / "job")
    )

    [own] = report["during"]  # the stale copy of a dead driver was swept; this driver's copy is there
    assert own.startswith(f"{report['job_id']}/raybatch_s3_settings_")
    assert report["upload_during"] is False  # taken out of the store as soon as it was read
    settings, filesystem_has_the_key = report["worker"]
    assert settings["secret_key"] == secret and filesystem_has_the_key
    assert report["after"] == []
    assert "RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S" in report["expired"]
    assert secret not in report["expired"]
