"""Real Airflow (`airflow standalone`: API server, scheduler, dag processor, triggerer) with the
provider, driven through the REST API and headless Chromium.

- The ticket-summary DAG runs on its schedule (the scheduler's own run, no date or conf given) and
  reads the day before the run, waits in the triggerer, and the task page shows the
  progress lines in its log and the "Ray job" link pointing at the job; the Asset event makes the
  scheduler run the downstream digest DAG. Screenshots are saved under the test's folder (and in
  $RAYBATCH_SCREENSHOTS when set).
- A task marked failed in the UI (the REST call the UI makes) while deferred stops its Ray job.
- A task whose process is killed while it waits on its job (a worker dying) is retried by the
  scheduler, and the retry attaches to that job: one Ray job for the run, every ticket once.
- A run deleted while its job runs and triggered again under its run id: the new run's job writes
  the version, every ticket once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from tests.conftest import (
    AIRFLOW_BIN,
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    free_cpus_held,
    run_date,
    warm_conf,
)
from tests.integration.deployments import SCHEDULED_TICKETS, scheduled_data_root, user_token
from tests.integration.standalone import Airflow
from tests.integration.test_ticket_summary_dag import TICKETS, _write_tickets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

DAG_ID = "daily_support_ticket_summary"
DIGEST_DAG_ID = "support_summary_digest"
TASK_ID = "summarise_tickets"
WORKER_KILL_DAG_ID = "raybatch_worker_kill"  # tests/integration/dags/: waits in its worker, one retry
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def airflow(shared_airflow: Airflow) -> Airflow:
    return shared_airflow


def _chromium(airflow: Airflow, url: str, screenshot: Path | None = None, dom: bool = True) -> str:
    """Load a page in headless Chromium signed in as ``admin``, let its scripts run, return the DOM (and
    save a screenshot).

    Each is a load of its own; ``dom=False`` spares the second where only the picture is wanted (a
    load under a cold engine's start took up to 120 s on 2 cores)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={screenshot.parent if screenshot else Path('/tmp')}/chromium-profile",
        "--window-size=1600,1000",
        "--virtual-time-budget=20000",
    ]
    with _signed_in(url, user_token(airflow, "admin")) as start:
        if screenshot is not None:
            _run_chromium([CHROMIUM, *flags, f"--screenshot={screenshot}", start])
        if not dom:
            return ""
        return _run_chromium([CHROMIUM, *flags, "--dump-dom", start])


@contextmanager
def _signed_in(url: str, token: str) -> Iterator[str]:
    """An address on loopback that hands the browser Airflow's session cookie (``_token``, as Airflow's
    login page sets it) and redirects to ``url``: a browser sends a host's cookies to every port of it,
    so the UI on its own port reads the cookie as after a login."""

    class SignIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(302)
            self.send_header("Set-Cookie", f"_token={token}; Path=/; SameSite=Lax")
            self.send_header("Location", url)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), SignIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _run_chromium(command: list[str]) -> str:
    """Its stdout; a second try after a first that ran 120 s. The UI's first page load, on a 2-core
    machine that starts a Ray job and its engine meanwhile, once took past 120 s (a later
    load of the same page, 15 s)."""

    def run() -> str:
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120).stdout

    try:
        return run()
    except subprocess.TimeoutExpired:
        return run()


def _save(paths: list[Path]) -> None:
    target = os.environ.get("RAYBATCH_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy(path, Path(target) / path.name)


def _conf(tiny_model: Path, data_root: Path) -> dict:
    return {
        "model": str(tiny_model),
        "data_root": str(data_root),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
        **warm_conf(),
    }


def test_a_scheduled_run_reads_the_day_before_and_its_task_page_shows_progress_and_the_ray_job_link(
    airflow: Airflow, ray_cluster, tmp_path
) -> None:
    """The example DAG on its schedule, with no date or conf given (the deployment's Param defaults:
    tests/integration/deployments.py): the scheduler's run reads the day that ended when it started
    (on Airflow 3 a plain "@daily" reads the day just starting), then the UI checks below."""
    airflow.api("PATCH", f"/dags/{DIGEST_DAG_ID}", json={"is_paused": False})
    airflow.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    run = airflow.wait(
        "the scheduler's run of the ticket DAG",
        lambda: next(
            (
                r
                for r in airflow.api("GET", f"/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
                if r["run_type"] == "scheduled"
            ),
            None,
        ),
    )
    run_id, day = run["dag_run_id"], run["data_interval_start"][:10]
    assert date.fromisoformat(day) == date.fromisoformat(run["run_after"][:10]) - timedelta(days=1), run
    data_root = scheduled_data_root(airflow)
    task_page = f"{airflow.url}/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/{TASK_ID}"
    shots: list[Path] = []

    # Or past it: another test's unpausing may have made this run earlier in the session.
    airflow.wait(
        "the task to defer",
        lambda: (
            airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] in ("deferred", "success", "failed")
            or None
        ),
    )
    shots.append(tmp_path / "1-task-deferred.png")
    _chromium(airflow, task_page, shots[-1], dom=False)

    ti = airflow.wait(
        "the task to finish",
        lambda: (
            ti
            if (ti := airflow.task_instance(DAG_ID, run_id, TASK_ID))["state"] in ("success", "failed")
            else None
        ),
    )
    assert ti["state"] == "success", ti
    job_id = airflow.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}/xcomEntries/job_id"
    ).json()["value"]

    # The API the UI reads: the log has the relayed progress lines, the links point at the job.
    events = airflow.task_log(DAG_ID, run_id, TASK_ID, ti["try_number"]).splitlines()
    progress = [
        event for event in events if f"Ray job {job_id}: " in event and f"/ {SCHEDULED_TICKETS} rows" in event
    ]
    assert progress, events[-40:]
    links = airflow.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}/links"
    ).json()["extra_links"]
    assert links["Ray job"] == f"{ray_cluster.address}/#/jobs/{job_id}"
    assert links["Batch output"] == f"file://{data_root}/ticket_summaries/{day}"
    # It read its day's tickets, every one, and no other day's.
    manifest = json.loads((data_root / "ticket_summaries" / day / "manifest.json").read_text())
    assert manifest["input_uri"] == f"{data_root}/tickets/{day}/"
    ids = [
        json.loads(line)["ticket_id"]
        for file in sorted(Path(manifest["outputs_uri"]).glob("*.jsonl"))
        for line in file.read_text().splitlines()
    ]
    assert sorted(ids) == [f"{day}/T-{i:03d}" for i in range(SCHEDULED_TICKETS)]
    assert str(links["Run report"]).endswith("/report.html")

    # The page itself, in a real browser: the task page opens on its log, with the progress lines.
    # (The extra links are checked above through the API the page reads them from.)
    shots.append(tmp_path / "2-task-done-log.png")
    page = _chromium(airflow, task_page, shots[-1])
    assert f"Ray job {job_id}: " in page and f"/ {SCHEDULED_TICKETS} rows" in page, page[-3000:]

    # The Asset event made the scheduler run the digest DAG.
    digest = airflow.wait(
        "the Asset-scheduled digest run",
        lambda: (
            runs[0]
            if (
                runs := [
                    r
                    for r in airflow.api("GET", f"/dags/{DIGEST_DAG_ID}/dagRuns").json()["dag_runs"]
                    if r["state"] == "success"
                ]
            )
            else None
        ),
        timeout=300,
    )
    assert digest["run_type"] == "asset_triggered"
    _save(shots)
    for shot in shots:
        assert shot.stat().st_size > 10_000  # a rendered page, not an empty canvas


def _deferred_run(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch, day: str, conf: dict, tickets: int
) -> tuple[str, str, str]:
    """Trigger the ticket DAG for ``day`` and wait until the triggerer runs its trigger: (run id, TI
    path, job id).

    Not just "deferred": Airflow calls a trigger's ``on_kill`` only once the triggerer has started it
    (about 2 s after the task defers; CI cleared in that gap once, and the next try attached to the
    running job).
    """
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl", tickets)
    run_id = airflow.trigger(DAG_ID, run_date(day), conf)
    airflow.wait(
        "the task to defer",
        lambda: True if airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred" else None,
    )
    path = f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}"
    job_id = airflow.api("GET", f"{path}/xcomEntries/job_id").json()["value"]
    polled = (f"Ray job {job_id} is ", f"Ray job {job_id}: ")  # the trigger's status and progress lines
    airflow.wait(
        "the triggerer to poll the job",
        lambda: (
            True if any(line in airflow.task_log(DAG_ID, run_id, TASK_ID, 1) for line in polled) else None
        ),
        every=1,
    )
    return run_id, path, job_id


def test_marking_a_deferred_task_failed_stops_its_ray_job(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    hook = RayHook()
    with free_cpus_held(hook):  # the job runs until the test stops it
        run_id, path, job_id = _deferred_run(
            airflow,
            ray_cluster,
            tiny_model,
            tmp_path,
            monkeypatch,
            "2026-11-13",
            _conf(tiny_model, tmp_path),
            TICKETS,
        )
        assert not hook.get_job_status(job_id).is_terminal

        airflow.api("PATCH", path, json={"new_state": "failed"})  # what "Mark as failed" sends

        status = airflow.wait(
            "the Ray job to stop",
            lambda: s if (s := hook.get_job_status(job_id)).is_terminal else None,
            timeout=120,
        )
    assert status == JobStatus.STOPPED
    assert airflow.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "failed"


def test_clearing_a_deferred_task_stops_its_job_and_the_next_try_finishes(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch
) -> None:
    """Clear in the UI while the task waits in the triggerer: the earlier try's job is stopped, and
    the next try finishes the batch with one job of its own (never two running at once), every
    ticket exactly once."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    hook = RayHook()
    with free_cpus_held(hook):  # the first try's job runs until the clear stops it
        run_id, path, first_job = _deferred_run(
            airflow,
            ray_cluster,
            tiny_model,
            tmp_path,
            monkeypatch,
            "2026-11-12",
            _conf(tiny_model, tmp_path),
            TICKETS,
        )
        airflow.clear(DAG_ID, run_id, TASK_ID)
        airflow.wait(
            "the clear to stop the first try's job",
            lambda: True if hook.get_job_status(first_job).is_terminal else None,
            timeout=120,
        )

    done = _finished(airflow, run_id, "the next try to finish")
    assert done["state"] == "success" and done["try_number"] == 2
    assert hook.get_job_status(first_job) == JobStatus.STOPPED
    jobs = [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == run_id]
    assert sorted(job.status.value for job in jobs) == ["STOPPED", "SUCCEEDED"]
    manifest = airflow.api("GET", f"{path}/xcomEntries/manifest").json()["value"]
    manifest = json.loads(manifest) if isinstance(manifest, str) else manifest
    assert _ticket_ids(manifest["outputs_uri"]) == [f"T-{i:03d}" for i in range(TICKETS)]
    assert manifest["rows_in"] == manifest["rows_out"] + manifest["rows_failed"] == TICKETS


def test_a_run_deleted_and_triggered_again_under_its_run_id_commits_each_ticket_once(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch
) -> None:
    """Delete a run in the UI while its job runs and trigger it again under the same run id (starting
    a manual run over). Airflow deletes no running run (409): the UI marks it failed first, which
    stops its job (the trigger's on_kill), the stop landing while the new run starts. The new run's
    try shares the old one's run key, so its staging, but neither adopts nor takes the old run's job
    (not this run's, by its ``run_after``): one job writes the version, every ticket once."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    hook = RayHook()
    day = "2026-11-10"
    conf = _conf(tiny_model, tmp_path)
    with free_cpus_held(hook):  # the old run's job runs until the new run's has been submitted
        run_id, path, old_job = _deferred_run(
            airflow, ray_cluster, tiny_model, tmp_path, monkeypatch, day, conf, TICKETS
        )
        run_path = f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}"
        airflow.api("PATCH", run_path, json={"state": "failed"})
        airflow.api("DELETE", run_path)
        body = {"dag_run_id": run_id, "logical_date": f"{run_date(day)}T00:00:00Z", "conf": conf}
        airflow.api("POST", f"/dags/{DAG_ID}/dagRuns", json=body)

        def submitted() -> object:
            job = _xcom_or_none(airflow, f"{path}/xcomEntries/job_id")  # the old run's went with it
            return None if job in (None, old_job) else job

        new_job = airflow.wait("the new run to submit a job of its own", submitted, every=1)

    done = _finished(airflow, run_id, "the new run's task to finish")
    assert (done["state"], done["try_number"]) == ("success", 1), airflow.why(DAG_ID, run_id, TASK_ID, 1)
    assert hook.get_job_status(old_job) == JobStatus.STOPPED
    jobs = [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == run_id]
    assert sorted(job.status.value for job in jobs) == ["STOPPED", "SUCCEEDED"]  # one job each, no third
    manifest = airflow.api("GET", f"{path}/xcomEntries/manifest").json()["value"]
    manifest = json.loads(manifest) if isinstance(manifest, str) else manifest
    committed = json.loads(Path(tmp_path, "ticket_summaries", day, "manifest.json").read_text())
    # The version the date shows is the new run's job's, never the deleted run's job's.
    assert (committed["job_id"], committed["version"]) == (new_job, manifest["version"]), committed
    assert _ticket_ids(committed["outputs_uri"]) == [f"T-{i:03d}" for i in range(TICKETS)]
    assert committed["rows_in"] == committed["rows_out"] + committed["rows_failed"] == TICKETS


def _finished(airflow: Airflow, run_id: str, what: str) -> dict:
    """The ticket task of ``run_id`` once it succeeded or failed."""
    return airflow.wait(
        what,
        lambda: (
            ti
            if (ti := airflow.task_instance(DAG_ID, run_id, TASK_ID))["state"] in ("success", "failed")
            else None
        ),
        timeout=900,
    )


def _ticket_ids(outputs_uri: str) -> list[str]:
    """The ticket ids of a version's outputs, sorted."""
    rows = [
        json.loads(line)
        for file in sorted(Path(outputs_uri).glob("*.jsonl"))
        for line in file.read_text().splitlines()
    ]
    return sorted(row["ticket_id"] for row in rows)


def _xcom_or_none(airflow: Airflow, path: str) -> object:
    try:
        return airflow.api("GET", path).json()["value"]
    except httpx.HTTPStatusError:  # 404 until the task has pushed it
        return None


def test_a_killed_worker_is_retried_and_the_retry_attaches_to_the_running_job(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path, monkeypatch
) -> None:
    """SIGKILL the task's process (``airflow worker -- <ti id>``) while it polls its Ray job: nothing
    runs on_kill, the supervisor reports the try failed, the scheduler retries it, and try 2 finds
    try 1's job by its metadata and waits on it instead of submitting another."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    day = "2026-11-11"
    _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl")
    hook = RayHook()
    with free_cpus_held(hook):  # try 1's job runs, on the warm engines, until try 2 has attached to it
        run_id = airflow.trigger(WORKER_KILL_DAG_ID, day, _conf(tiny_model, tmp_path))
        path = f"/dags/{WORKER_KILL_DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}"

        def submitted() -> object:
            state = airflow.task_instance(WORKER_KILL_DAG_ID, run_id, TASK_ID)["state"]
            assert state in (None, "scheduled", "queued", "running"), f"try 1 ended {state} before the kill"
            return _xcom_or_none(airflow, f"{path}/xcomEntries/job_id")

        job_id = airflow.wait("try 1 to submit its job", submitted, every=1)
        assert not hook.get_job_status(job_id).is_terminal
        ti = airflow.task_instance(WORKER_KILL_DAG_ID, run_id, TASK_ID)
        assert (ti["state"], ti["try_number"]) == ("running", 1)
        [pid] = subprocess.run(
            ["pgrep", "-f", f"airflow worker -- {ti['id']}"], capture_output=True, text=True
        ).stdout.split()
        os.kill(int(pid), signal.SIGKILL)

        def attached() -> bool | None:
            try:
                log = airflow.task_log(WORKER_KILL_DAG_ID, run_id, TASK_ID, 2)
            except httpx.HTTPError:  # until try 2 has a log
                return None
            return True if f"{job_id}" in log and "attaching to it" in log else None

        airflow.wait("try 2 to attach to try 1's job", attached, every=2)

    done = airflow.wait(
        "the retry to finish",
        lambda: (
            t
            if (t := airflow.task_instance(WORKER_KILL_DAG_ID, run_id, TASK_ID))["state"]
            in ("success", "failed")
            else None
        ),
        timeout=900,
    )
    assert (done["state"], done["try_number"]) == ("success", 2)
    jobs = [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == run_id]
    assert [(job.job_id, job.status) for job in jobs] == [(job_id, JobStatus.SUCCEEDED)]  # no second job
    events = airflow.task_log(WORKER_KILL_DAG_ID, run_id, TASK_ID, 2).splitlines()
    assert any(job_id in event and "attaching to it" in event for event in events), events
    manifest = airflow.api("GET", f"{path}/xcomEntries/manifest").json()["value"]
    manifest = json.loads(manifest) if isinstance(manifest, str) else manifest
    assert _ticket_ids(manifest["outputs_uri"]) == [f"T-{i:03d}" for i in range(TICKETS)]


#: A backfill as the UI starts one: two dates from the CLI (``airflow backfill create``), two at a
#: time; then one from the REST API (``POST /api/v2/backfills``, what the UI's "Backfill" dialog
#: sends), which starts on the engine the first two left warm. (More dates than these only repeat the
#: API date's warm start, ~25 s of CI each.)
BACKFILL_CLI_DATES = [f"2026-10-0{day}" for day in range(1, 3)]
BACKFILL_API_DATES = ["2026-10-04"]


def _backfill_runs(airflow: Airflow, dates: list[str]) -> list[dict]:
    """The backfill runs of ``dates`` (the API's DAG runs name their type, not their backfill)."""
    runs = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"limit": 100}).json()["dag_runs"]
    return [run for run in runs if run["run_type"] == "backfill" and run["logical_date"][:10] in dates]


def _wait_for_backfill(airflow: Airflow, backfill_id: int, dates: list[str]) -> list[dict]:
    def finished() -> list[dict] | None:
        runs = _backfill_runs(airflow, dates)
        states = [run["state"] for run in runs]
        assert "failed" not in states, (
            f"backfill {backfill_id}: {[(r['logical_date'], r['state']) for r in runs]}"
        )
        if len(runs) != len(dates) or set(states) != {"success"}:
            return None
        # Done once the scheduler marks it so: until then a new backfill of the DAG is refused (409).
        return runs if airflow.api("GET", f"/backfills/{backfill_id}").json()["completed_at"] else None

    return airflow.wait(f"backfill {backfill_id} of {len(dates)} dates", finished, timeout=1200, every=5)


def _drop_backfills(airflow: Airflow, dates: list[str]) -> None:
    """Cancel a half-made backfill and delete its runs of ``dates``: what a user does before trying again."""
    for backfill in airflow.api("GET", "/backfills", params={"dag_id": DAG_ID}).json()["backfills"]:
        if backfill.get("completed_at") is None:
            airflow.api("PUT", f"/backfills/{backfill['id']}/cancel")
        for run in _backfill_runs(airflow, dates):
            airflow.api("DELETE", f"/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'])}")


def _date_manifest(tmp_path: Path, day: str) -> dict:
    manifest = json.loads((tmp_path / "ticket_summaries" / day / "manifest.json").read_text())
    assert _ticket_ids(manifest["outputs_uri"]) == [f"T-{i:03d}" for i in range(TICKETS)]
    return manifest


def test_a_backfill_from_the_cli_and_the_rest_api_runs_its_dates_on_one_warm_engine(
    airflow: Airflow, ray_cluster, tiny_model, tmp_path
) -> None:
    """`airflow backfill create` and `POST /backfills`, two dates at a time, keep_warm_seconds set: every
    date commits every ticket once, and the dates after the first ones start on the engine the
    earlier dates left warm (one engine start-up for the backfill)."""
    for day in [*BACKFILL_CLI_DATES, *BACKFILL_API_DATES]:
        _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl")
    # 300 s: the API's backfill starts after the CLI's last date; on a loaded CI machine that gap once
    # passed 120 s, and its dates found the pool gone.
    conf = {**_conf(tiny_model, tmp_path), "keep_warm_seconds": 300}
    airflow.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(airflow.home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(airflow.home / "dags"),
        # SQLite: the CLI's inserts wait for the scheduler's write lock up to 60 s, not sqlite3's 5 s
        # ("database is locked" at the 7th date's run, seen here).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow.home}/airflow.db?timeout=60",
    }
    dates = ["--from-date", BACKFILL_CLI_DATES[0], "--to-date", BACKFILL_CLI_DATES[-1]]
    command = [
        str(AIRFLOW_BIN),
        "backfill",
        "create",
        "--dag-id",
        DAG_ID,
        *dates,
        "--max-active-runs",
        "2",
        "--dag-run-conf",
        json.dumps(conf),
    ]
    for _ in range(5):
        created = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if created.returncode == 0 or "database is locked" not in created.stderr + created.stdout:
            break
        # SQLite: the CLI's insert met the scheduler's write lock. What a user does: cancel the half-made
        # backfill (Airflow removes it itself on Postgres and MySQL), delete its runs, run the CLI again.
        _drop_backfills(airflow, BACKFILL_CLI_DATES)
    assert created.returncode == 0, created.stdout[-2000:] + created.stderr[-2000:]
    backfills = airflow.api("GET", "/backfills", params={"dag_id": DAG_ID}).json()["backfills"]
    cli_backfill = max(backfills, key=lambda backfill: backfill["id"])  # after any cancelled half-made one
    cli_runs = _wait_for_backfill(airflow, cli_backfill["id"], BACKFILL_CLI_DATES)

    body = {
        "dag_id": DAG_ID,
        "from_date": f"{BACKFILL_API_DATES[0]}T00:00:00Z",
        "to_date": f"{BACKFILL_API_DATES[-1]}T00:00:00Z",
        "max_active_runs": 2,
        "dag_run_conf": conf,
    }
    for _ in range(5):
        try:
            api_backfill = airflow.api("POST", "/backfills", json=body).json()
            break
        except httpx.HTTPStatusError as err:
            # SQLite: the API's insert met the scheduler's write lock (503, then 500 on the half-made
            # backfill, on a loaded machine), as the CLI's can: cancel it, delete its runs, again.
            if err.response.status_code < 500:
                raise
            _drop_backfills(airflow, BACKFILL_API_DATES)
    else:
        log = (airflow.home / "standalone.log").read_text(errors="replace").splitlines()[-60:]
        raise AssertionError("POST /backfills failed five times; standalone.log:\n" + "\n".join(log))
    api_runs = _wait_for_backfill(airflow, api_backfill["id"], BACKFILL_API_DATES)

    assert sorted(run["logical_date"][:10] for run in cli_runs) == BACKFILL_CLI_DATES
    assert sorted(run["logical_date"][:10] for run in api_runs) == BACKFILL_API_DATES
    manifests = [_date_manifest(tmp_path, day) for day in [*BACKFILL_CLI_DATES, *BACKFILL_API_DATES]]
    pools = [manifest["engine_pool"] for manifest in manifests]
    assert len({pool["fingerprint"] for pool in pools}) == 1  # every date on the same engines
    # Two dates at a time: the first two may both start the pool; every later date finds it warm.
    cold = [
        day
        for day, pool in zip([*BACKFILL_CLI_DATES, *BACKFILL_API_DATES], pools, strict=True)
        if pool["warm_replicas"] == 0
    ]
    assert set(cold) <= set(BACKFILL_CLI_DATES[:2]), cold
