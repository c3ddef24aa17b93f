"""Issue 20 point 2 on a GPU: a 7-date backfill started the way the Airflow UI starts one, through Airflow.

Runs on the device (run_gpu.sh's ``af:backfill``), where the Airflow side is carried as wheels
(bench/gpu/pack_airflow.sh) and installed into /tmp/afsite, apart from the cluster side's /tmp/site:
the two sides stay two environments, as on a user's deployment. It

1. writes a DAG of one ``RayLLMBatchOperator`` with the workload of ``bench/gpu/jobs/backfill-d1.json``
   (the 8B shape, 2,000 rows of 128 prompt ids, 128 tokens out, ``keep_warm_seconds=600``, every other
   setting as the benchmark's Jobs-API backfill) and ``output_uri`` per date;
2. starts ``airflow standalone`` (API server, scheduler with LocalExecutor, dag processor, triggerer;
   SQLite) with a ``ray`` connection to the local head;
3. runs ``airflow backfill create --from-date D1 --to-date D7 --max-active-runs N`` and waits for the
   scheduler to finish every date;
4. prints a table per date (the task's wall, the manifest's engine start to first row and generating,
   whether the pool was warm, rows out) and, when KEEP holds run_gpu.sh's 7 raw scripts
   (``a:2000@d1..d7``, the same lease), raw's total against the backfill's wall; writes JSON.

The backfill's wall is ``airflow backfill create`` to the last date's end: what a user waits for.

usage: python3 bench/gpu/airflow_backfill.py KEEP OUT_JSON [MAX_ACTIVE_RUNS]   (PYTHONPATH: see run_gpu.sh)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
HOME = Path("/tmp/afhome")
PORT = int(os.environ.get("AF_PORT", 8471))
DAG_ID = "bench_gpu_backfill"
DATES = [f"2026-10-0{day}" for day in range(1, 1 + int(os.environ.get("AF_DATES", 7)))]
OUTPUT_ROOT = "/tmp/gpu_out/af-backfill"
#: A rehearsal on the CPU VM: another job's workload (AF_JOB: a bench/gpu/jobs-style JSON), fewer dates
#: (AF_DATES), a token-auth head (AF_RAY_CONN: the connection's JSON).
JOB = Path(os.environ.get("AF_JOB", str(HERE / "jobs" / "backfill-d1.json")))

_DAG = '''"""bench/gpu/airflow_backfill.py's DAG: the backfill benchmark's workload, one date per run."""
import json
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

SPEC = json.loads({spec!r})

with DAG("{dag_id}", schedule="@daily", start_date=datetime(2026, 10, 1), catchup=False,
         max_active_runs={max_active_runs}):
    RayLLMBatchOperator(
        task_id="generate",
        model=SPEC["model"],
        input_uri=SPEC["input_uri"],
        output_uri="{output_root}/{{{{ ds }}}}",
        output_format=SPEC["output_format"],
        user_template=SPEC["user_template"],
        sampling_params=SPEC["sampling_params"],
        engine_kwargs=SPEC["engine_kwargs"],
        batch_size=SPEC["batch_size"],
        concurrency=SPEC["concurrency"],
        id_column=SPEC["id_column"],
        max_failed_fraction=SPEC["max_failed_fraction"],
        keep_warm_seconds=SPEC["keep_warm_seconds"],
        replica_resources=SPEC["replica_resources"],
    )
'''


def _api(path: str, method: str = "GET", body: Any = None) -> Any:  # Any: JSON values.
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/api/v2{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"null")


def _wait(what: str, check: Any, timeout: float, every: float = 3) -> Any:  # Any: a callable; its value
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except OSError:
            value = None
        if value is not None:
            return value
        time.sleep(every)
    raise SystemExit(f"gave up waiting for {what} after {timeout} s")


def _env() -> dict[str, str]:
    afsite = os.environ.get("AFSITE", "/tmp/afsite")
    repo = str(HERE.parents[1])
    return {
        **{key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        # The Airflow side: its own packages, our checkout first (the wheel in afsite gives the entry points).
        "PYTHONPATH": f"{repo}:{afsite}",
        "PATH": f"{afsite}/bin:{os.environ['PATH']}",
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(HOME / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__API__PORT": str(PORT),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{PORT}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{PORT}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # SQLite: the CLI's inserts wait for the scheduler's write lock up to 60 s (tests/integration).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME}/airflow.db?timeout=60",
        "AIRFLOW_CONN_RAY_DEFAULT": os.environ.get(
            "AF_RAY_CONN", json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": 8265})
        ),
    }


def _date_row(run: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    day = run["logical_date"][:10]
    manifest_path = Path(OUTPUT_ROOT) / day / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    timings = manifest.get("timings") or {}
    pool = manifest.get("engine_pool") or {}
    start, end = task.get("start_date"), task.get("end_date")
    wall = (
        (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
        if start and end
        else None
    )
    return {
        "date": day,
        "state": run["state"],
        "task_start": start,
        "task_end": end,
        "task_wall_s": wall and round(wall, 1),
        "engine_start_to_first_row_s": timings.get("engine_start_to_first_row_s"),
        "generating_s": timings.get("generating_s"),
        "warm_replicas": pool.get("warm_replicas"),
        "rows_out": manifest.get("rows_out"),
        "rows_failed": manifest.get("rows_failed"),
    }


def _raw_total(keep: Path) -> float | None:
    raws = [keep / f"a-2000@d{day}.json" for day in range(1, 8)]
    if not all(path.exists() for path in raws):
        return None
    return round(sum(json.loads(path.read_text())["end_to_end_s"] for path in raws), 1)


def main() -> None:
    keep, out = Path(sys.argv[1]), Path(sys.argv[2])
    max_active_runs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    spec = json.loads(JOB.read_text())["spec"]
    (HOME / "dags").mkdir(parents=True, exist_ok=True)
    (HOME / "dags" / f"{DAG_ID}.py").write_text(
        _DAG.format(
            spec=json.dumps(spec), dag_id=DAG_ID, max_active_runs=max_active_runs, output_root=OUTPUT_ROOT
        )
    )
    env = _env()
    log = (keep / "logs" / "airflow-standalone.log").open("w")
    started = time.time()
    standalone = subprocess.Popen(
        [sys.executable, "-m", "airflow", "standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=HOME,
    )
    result: dict[str, Any] = {"max_active_runs": max_active_runs, "dates": DATES}  # Any: JSON values.
    try:
        _wait("the API server and the DAG", lambda: _api(f"/dags/{DAG_ID}") or None, timeout=300)
        result["standalone_up_s"] = round(time.time() - started, 1)
        print(f"airflow standalone up in {result['standalone_up_s']} s", flush=True)
        _api(f"/dags/{DAG_ID}", "PATCH", {"is_paused": False})
        t_create = time.time()
        created = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow",
                "backfill",
                "create",
                "--dag-id",
                DAG_ID,
                "--from-date",
                DATES[0],
                "--to-date",
                DATES[-1],
                "--max-active-runs",
                str(max_active_runs),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        print(f"backfill create rc={created.returncode}: {created.stdout[-500:]} {created.stderr[-1500:]}")
        if created.returncode != 0:
            raise SystemExit(1)

        def finished() -> list[dict[str, Any]] | None:  # Any: JSON values.
            runs = [
                r
                for r in _api(f"/dags/{DAG_ID}/dagRuns?limit=100")["dag_runs"]
                if r["run_type"] == "backfill"
            ]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            print(f"{time.strftime('%T')} {len(done)}/{len(DATES)} dates done", flush=True)
            return runs if len(done) == len(DATES) else None

        runs = _wait(
            "the backfill's dates", finished, timeout=float(os.environ.get("BACKFILL_LIMIT", 1800)), every=5
        )
        t_done = time.time()
        rows = []
        for run in sorted(runs, key=lambda r: r["logical_date"]):
            task = _api(f"/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'])}/taskInstances/generate")
            rows.append(_date_row(run, task))
        last_end = max(datetime.fromisoformat(r["end_date"]).timestamp() for r in runs if r.get("end_date"))
        raw_total = _raw_total(keep)
        backfill_wall = round(last_end - t_create, 1)
        result.update(
            rows=rows,
            backfill_wall_s=backfill_wall,
            observed_wall_s=round(t_done - t_create, 1),
            raw_total_s=raw_total,
            ratio_raw_over_ours=raw_total and round(raw_total / backfill_wall, 2),
        )
    finally:
        os.killpg(standalone.pid, signal.SIGTERM)
        try:
            standalone.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(standalone.pid, signal.SIGKILL)
        log.close()
        out.write_text(json.dumps(result, indent=1))
    header = list(result["rows"][0])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in result["rows"]:
        print("| " + " | ".join(str(value) for value in row.values()) + " |")
    print(
        f"AFBACKFILL wall {result['backfill_wall_s']} s (create to the last date's end), raw 7 scripts "
        f"{result['raw_total_s']} s, raw/ours {result['ratio_raw_over_ours']}"
    )


if __name__ == "__main__":
    main()
