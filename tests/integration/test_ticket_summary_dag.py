"""The second example DAG through real Airflow: free-text summaries, progress relayed into the task
log, the extra links, and the output Asset event for the downstream digest DAG."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import AIRFLOW_BIN, CPU_ENGINE_KWARGS, CPU_REPLICA, run_date, warm_conf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DAG_ID = "daily_support_ticket_summary"
TICKETS = 30


def _write_tickets(path: Path, count: int = TICKETS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "ticket_id": f"T-{i:03d}",
            "subject": f"Order {i} late",
            "body": f"My order {i} has not arrived yet.",
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_summaries_progress_links_and_asset_event(airflow_env, ray_cluster, tiny_model, tmp_path) -> None:
    day = "2026-11-17"
    _write_tickets(tmp_path / "tickets" / day / "tickets.jsonl")
    # The scheduler's view of the DAGs folder, so the Asset's consumers are known when the event lands.
    subprocess.run(
        [str(AIRFLOW_BIN), "dags", "reserialize"],
        env=airflow_env.env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    conf = {
        "model": str(tiny_model),
        "data_root": str(tmp_path),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
        **warm_conf(),
    }

    result = airflow_env.dags_test(DAG_ID, run_date(day), conf)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "state=success" in log, log[-4000:]

    xcoms = airflow_env.xcoms(DAG_ID, run_date(day))
    manifest = xcoms[("summarise_tickets", "manifest")]
    job_id = str(xcoms[("summarise_tickets", "job_id")])
    assert (manifest["rows_in"], manifest["rows_out"] + manifest["rows_failed"]) == (TICKETS, TICKETS)
    assert manifest["rows_out"] > 0 and manifest["tokens_out"] > 0
    outputs = [
        json.loads(line)
        for path in sorted(Path(manifest["outputs_uri"]).glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(outputs) == manifest["rows_out"]
    assert all(
        isinstance(row["generated_text"], str) and row["subject"].startswith("Order") for row in outputs
    )

    # Progress, relayed by the trigger from the driver log at a bounded rate.
    progress = [
        line for line in log.splitlines() if f"Ray job {job_id}: " in line and f"/ {TICKETS} rows" in line
    ]
    assert progress, log[-4000:]
    assert len(progress) <= 10  # bounded: not one per poll
    pool = manifest.get("engine_pool")
    if pool:  # on a warm pool (the tests' default, warm_conf): the log says whether it was warm
        warm = f"Ray job {job_id} ran on engine pool {pool['fingerprint']}: {pool['warm_replicas']} of "
        assert warm in log, log[-4000:]
    else:  # RAYBATCH_TEST_KEEP_WARM_SECONDS=0: its own engines, nothing said
        assert f"Ray job {job_id} ran on engine pool" not in log

    # Extra links, kept as XComs by Airflow.
    assert xcoms[("summarise_tickets", "_link_RayJobLink")] == f"{ray_cluster.address}/#/jobs/{job_id}"
    assert (
        xcoms[("summarise_tickets", "_link_BatchOutputLink")] == f"file://{tmp_path}/ticket_summaries/{day}"
    )
    assert xcoms[("summarise_tickets", "_link_RunReportLink")] == f"file://{manifest['report_uri']}"

    # The run report beside the outputs: self-contained, with this run's counts.
    report = Path(manifest["report_uri"]).read_text()
    assert Path(manifest["report_uri"]).parent == Path(manifest["outputs_uri"]).parent
    assert "<script" not in report and "http://" not in report and "https://" not in report
    assert str(tiny_model) in report and "Errors by reason" in report

    # The Asset event with this run's extras, queued for the Asset-scheduled digest DAG.
    with sqlite3.connect(airflow_env.home / "airflow.db") as db:
        events = db.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON e.asset_id = a.id WHERE a.name = ?",
            ("support_ticket_summaries",),
        ).fetchall()
        consumers = db.execute(
            "SELECT r.dag_id FROM dag_schedule_asset_reference r JOIN asset a ON r.asset_id = a.id "
            "WHERE a.name = ?",
            ("support_ticket_summaries",),
        ).fetchall()
    extras = [json.loads(extra) for (extra,) in events]
    ours = [extra for extra in extras if extra.get("job_id") == job_id]
    assert len(ours) == 1, extras
    assert ours[0]["output_uri"] == f"{tmp_path}/ticket_summaries/{day}"
    assert ours[0]["manifest_uri"] == f"{tmp_path}/ticket_summaries/{day}/manifest.json"
    assert (ours[0]["rows_in"], ours[0]["rows_out"]) == (TICKETS, manifest["rows_out"])
    # The digest DAG is scheduled on that Asset (test_airflow_ui.py sees the scheduler start it).
    assert consumers == [("support_summary_digest",)]
