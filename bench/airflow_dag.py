"""(c) The Airflow overhead around a Ray job: the example DAG through ``airflow dags test``.

Runs ``dags/daily_company_industry.py`` on the tiny model (deferrable path: the RayJobTrigger polls
at its default pace, run inline by ``dags test``), then lines up
  - the task instance's start/end (Airflow DB: start_date is kept across the deferral),
  - the Ray job's start/end (Jobs API; the job id from the XCom),
  - the ``dags test`` log's own timestamps (submitted, deferred, each poll, trigger completed, end).
Reports task wall - job wall, task start -> job start, and job end -> task success.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster import ROOT, LocalCluster

AIRFLOW = ROOT / ".venvs" / "airflow" / "bin" / "airflow"
RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"
DAG_ID = "daily_company_industry"
TASK_ID = "classify_industry"
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")
_MARKS = {
    "dag_test_start": r"\[DAG TEST\] starting task_id=classify_industry",
    "submitted": r"Submitted Ray job",
    "deferred": r"Pausing task as DEFERRED",
    "trigger_completed": r"\[DAG TEST\] Trigger completed",
    "task_done_logged": r"done: \d+ rows in",
    "task_end": r"\[DAG TEST\] end task task_id=classify_industry",
}


def _utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _log_marks(text: str) -> tuple[dict[str, float], list[float]]:
    marks: dict[str, float] = {}
    polls: list[float] = []
    for line in text.splitlines():
        match = _LOG_TIME.match(line)
        if not match:
            continue
        for name, pattern in _MARKS.items():
            if name not in marks and re.search(pattern, line):
                marks[name] = _utc(match.group(1))
        # A state line (on a change, else once a minute since 1d4528a+1) or a progress line (every 60 s).
        if re.search(r"Ray job \S+ is (PENDING|RUNNING)\.|Ray job \S+: ", line):
            polls.append(_utc(match.group(1)))
    return marks, polls


def run(cluster: LocalCluster, state: Path, run_dir: Path, rows: int = 250) -> dict[str, Any]:  # Any: JSON
    print(f"[bench {datetime.now():%H:%M:%S}] (c) Airflow: example DAG through airflow dags test", flush=True)
    home = state / "airflow"
    day = "2026-11-20"
    data_root = run_dir / "dag_data"
    model = state / "tiny-llama"
    subprocess.run(
        [str(RAY_PYTHON), str(ROOT / "scripts" / "make_tiny_model.py"), str(model)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_sample_customers.py"),
            str(data_root / "customers" / day / "customers.csv"),
            "--date",
            day,
            "--rows",
            str(rows),
        ],
        check=True,
        capture_output=True,
    )
    env = {
        **cluster.env(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_RAY_DEFAULT": cluster.connection_json(),
    }
    subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    conf = {
        "model": str(model),
        "data_root": str(data_root),
        "engine_kwargs": {"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": True},
        "replica_resources": {"CPU": 1},
    }
    t0 = time.time()
    result = subprocess.run(
        [str(AIRFLOW), "dags", "test", DAG_ID, day, "--conf", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    t_exit = time.time()
    text = result.stdout + result.stderr
    (run_dir / "dags_test.log").write_text(text)
    if result.returncode != 0 or "state=success" not in text:
        raise RuntimeError(f"airflow dags test failed; see {run_dir / 'dags_test.log'}")

    with sqlite3.connect(home / "airflow.db") as db:
        start, end, run_id = db.execute(
            "SELECT start_date, end_date, run_id FROM task_instance WHERE dag_id = ? AND task_id = ? "
            "ORDER BY start_date DESC LIMIT 1",
            (DAG_ID, TASK_ID),
        ).fetchone()
        (job_id_json,) = db.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND run_id = ? AND key = 'job_id'",
            (DAG_ID, TASK_ID, run_id),
        ).fetchone()
    job_id = json.loads(job_id_json)
    import httpx

    job = httpx.get(f"{cluster.address}/api/jobs/{job_id}", headers=cluster.auth_headers(), timeout=30).json()
    ti_start, ti_end = _utc(start), _utc(end)
    job_start, job_end = job["start_time"] / 1000, job["end_time"] / 1000
    marks, polls = _log_marks(text)
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False)]
    out = {
        "dags_test_process_s": t_exit - t0,
        "task_wall_s": ti_end - ti_start,
        "job_wall_s": job_end - job_start,
        "task_minus_job_s": (ti_end - ti_start) - (job_end - job_start),
        "task_start_to_job_start_s": job_start - ti_start,
        "task_start_to_submitted_s": marks.get("submitted", float("nan")) - ti_start,
        "job_end_to_trigger_completed_s": marks.get("trigger_completed", float("nan")) - job_end,
        "trigger_completed_to_task_success_s": ti_end - marks.get("trigger_completed", float("nan")),
        "job_end_to_task_success_s": ti_end - job_end,
        "poll_interval_seconds": "the operator's default (paced: 1 s for one job)",
        "polls_logged": len(polls),
        "max_gap_between_polls_s": max(gaps, default=None),
        "job_id": job_id,
        "rows": rows,
    }
    out["table"] = "\n".join(
        ["| Airflow (example DAG, `airflow dags test`, deferrable) | s |", "|---|---|"]
        + [
            f"| {key} | {value:.2f} |"
            for key, value in out.items()
            if key.endswith("_s") and value is not None
        ]
    )
    print(
        f"[bench {datetime.now():%H:%M:%S}] (c) done: task {out['task_wall_s']:.1f} s, job "
        f"{out['job_wall_s']:.1f} s, job end -> task success {out['job_end_to_task_success_s']:.1f} s",
        flush=True,
    )
    return out
