"""Real Airflow (`airflow standalone`: API server, scheduler, dag processor, triggerer) with the
provider, driven through the REST API and headless Chromium.

- The ticket-summary DAG runs on the scheduler, waits in the triggerer, and the task page shows the
  progress lines in its log and the "Ray job" link pointing at the job; the Asset event makes the
  scheduler run the downstream digest DAG. Screenshots are saved under the test's folder (and in
  $RAYBATCH_SCREENSHOTS when set).
- A task marked failed in the UI (the REST call the UI makes) while deferred stops its Ray job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from tests.integration.conftest import AIRFLOW_BIN, CPU_ENGINE_KWARGS, CPU_REPLICA, ROOT
from tests.integration.test_ticket_summary_dag import TICKETS, _write_tickets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

API_PORT = 8299
DAG_ID = "daily_support_ticket_summary"
DIGEST_DAG_ID = "support_summary_digest"
TASK_ID = "summarise_tickets"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@dataclass(frozen=True)
class Airflow:
    url: str
    home: Path

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = httpx.request(method, f"{self.url}/api/v2{path}", timeout=30, **kwargs)
        response.raise_for_status()
        return response

    def wait(self, what: str, check, timeout: float = 600, every: float = 3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (value := check()) is not None:
                return value
            time.sleep(every)
        raise AssertionError(f"gave up waiting for {what} after {timeout} s")

    def trigger(self, dag_id: str, day: str, conf: dict) -> str:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        body = {"logical_date": f"{day}T00:00:00Z", "conf": conf}
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body).json()["dag_run_id"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}").json()


@pytest.fixture(scope="module")
def airflow(ray_cluster, tmp_path_factory) -> Iterator[Airflow]:
    home = tmp_path_factory.mktemp("airflow-standalone")
    env = {
        **os.environ,
        "PATH": f"{AIRFLOW_BIN.parent}:{os.environ['PATH']}",  # standalone starts `airflow` subcommands
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__PORT": str(API_PORT),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{API_PORT}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{API_PORT}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # a local test instance: no login
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW_CONN_RAY_DEFAULT": ray_cluster.connection_json(),
    }
    log = (home / "standalone.log").open("w")
    process = subprocess.Popen([str(AIRFLOW_BIN), "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, cwd=home)  # fmt: skip
    instance = Airflow(f"http://127.0.0.1:{API_PORT}", home)

    def dags_ready():
        try:
            ids = {d["dag_id"] for d in instance.api("GET", "/dags", params={"limit": 100}).json()["dags"]}
        except httpx.HTTPError:
            return None
        return True if {DAG_ID, DIGEST_DAG_ID} <= ids else None

    try:
        instance.wait("the API server and the parsed DAGs", dags_ready, timeout=300)
        yield instance
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def _chromium(url: str, screenshot: Path | None = None) -> str:
    """Load a page in headless Chromium, let its scripts run, return the DOM (and save a screenshot)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={screenshot.parent if screenshot else Path('/tmp')}/chromium-profile",
             "--window-size=1600,1000", "--virtual-time-budget=20000"]  # fmt: skip
    if screenshot is not None:
        subprocess.run([CHROMIUM, *flags, f"--screenshot={screenshot}", url], check=True, capture_output=True, timeout=120)
    return subprocess.run([CHROMIUM, *flags, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120).stdout


def _save(paths: list[Path]) -> None:
    target = os.environ.get("RAYBATCH_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy(path, Path(target) / path.name)


def _conf(tiny_model: Path, data_root: Path) -> dict:
    return {"model": str(tiny_model), "data_root": str(data_root), "engine_kwargs": CPU_ENGINE_KWARGS,
            "replica_resources": CPU_REPLICA}  # fmt: skip


def test_task_page_shows_progress_and_the_ray_job_link(airflow: Airflow, ray_cluster, tiny_model, tmp_path) -> None:
    day = "2026-11-14"
    _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl")
    airflow.api("PATCH", f"/dags/{DIGEST_DAG_ID}", json={"is_paused": False})
    run_id = airflow.trigger(DAG_ID, day, _conf(tiny_model, tmp_path))
    task_page = f"{airflow.url}/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/{TASK_ID}"
    shots: list[Path] = []

    airflow.wait("the task to defer", lambda: True if airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred" else None)
    shots.append(tmp_path / "1-task-deferred.png")
    _chromium(task_page, shots[-1])

    ti = airflow.wait(
        "the task to finish",
        lambda: ti if (ti := airflow.task_instance(DAG_ID, run_id, TASK_ID))["state"] in ("success", "failed") else None,
    )
    assert ti["state"] == "success", ti
    job_id = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}/xcomEntries/job_id").json()["value"]

    # The API the UI reads: the log has the relayed progress lines, the links point at the job.
    content = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}/logs/{ti['try_number']}",
                          params={"full_content": "true"}).json()["content"]  # fmt: skip
    events = [str(entry.get("event", "")) if isinstance(entry, dict) else str(entry) for entry in content]
    progress = [event for event in events if f"Ray job {job_id}: " in event and f"/ {TICKETS} rows" in event]
    assert progress, events[-40:]
    links = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}/links").json()["extra_links"]
    assert links["Ray job"] == f"{ray_cluster.address}/#/jobs/{job_id}"
    assert links["Batch output"] == f"file://{tmp_path}/ticket_summaries/{day}"
    assert str(links["Run report"]).endswith("/report.html")

    # The page itself, in a real browser: the task page opens on its log, with the progress lines.
    # (The extra links are checked above through the API the page reads them from.)
    shots.append(tmp_path / "2-task-done-log.png")
    page = _chromium(task_page, shots[-1])
    assert f"Ray job {job_id}: " in page and f"/ {TICKETS} rows" in page, page[-3000:]

    # The Asset event made the scheduler run the digest DAG.
    digest = airflow.wait(
        "the Asset-scheduled digest run",
        lambda: runs[0] if (runs := [r for r in airflow.api("GET", f"/dags/{DIGEST_DAG_ID}/dagRuns").json()["dag_runs"]
                                     if r["state"] == "success"]) else None,
        timeout=300,
    )  # fmt: skip
    assert digest["run_type"] == "asset_triggered"
    _save(shots)
    for shot in shots:
        assert shot.stat().st_size > 10_000  # a rendered page, not an empty canvas


def test_marking_a_deferred_task_failed_stops_its_ray_job(airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    day = "2026-11-13"
    _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl")
    run_id = airflow.trigger(DAG_ID, day, _conf(tiny_model, tmp_path))
    airflow.wait("the task to defer", lambda: True if airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred" else None)
    path = f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}"
    job_id = airflow.api("GET", f"{path}/xcomEntries/job_id").json()["value"]
    hook = RayHook()
    assert not hook.get_job_status(job_id).is_terminal

    airflow.api("PATCH", path, json={"new_state": "failed"})  # what "Mark as failed" sends

    status = airflow.wait("the Ray job to stop", lambda: s if (s := hook.get_job_status(job_id)).is_terminal else None, timeout=120)
    assert status == JobStatus.STOPPED
    assert airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "failed"
