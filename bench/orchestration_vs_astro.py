"""Issue 20 point 3: task wall minus Ray job wall, this provider beside astro-provider-ray, in one run.

One Ray head (bench/cluster.py's LocalCluster on ports of its own), ``airflow dags test`` for every
run (each run its own AIRFLOW_HOME and SQLite DB, copied from a migrated template), the
configurations interleaved round by round (A B C ..., A B C ..., so the machine's load hits all alike):

  astro_default   astro-provider-ray 0.4.0 SubmitRayJob (deferrable), poll_interval default (60 s)
  astro_poll5     the same, poll_interval=5
  sensor_default  ours: a task submits the same trivial job (RayHook), RayJobSensor (deferrable)
                  waits, at its default poke_interval (Airflow's 60 s)
  sensor_poll5    the same, poke_interval=5
  llm_default     ours: RayLLMBatchOperator (deferrable) on the tiny model, default pace (None)
  llm_poll5       the same, poll_interval_seconds=5

The trivial job is ``python -c "import time; time.sleep(20)"`` (the DAG files under
bench/dags_orchestration/). For each run: task wall (the first task's task_instance.start_date -> the
last task's end_date, from the run's Airflow DB) minus the Ray job wall (Jobs API start_time ->
end_time), task start -> job start, job end -> task success, and from the ``dags test`` log, job end ->
"Trigger completed". Prints a markdown table of medians (min-max) and writes JSON after every run.

usage (under the Ray lock, as bench/run_cpu.sh runs the other benchmarks):
  flock /tmp/raybatch-ray.lock env RAYBATCH_BENCH_LOCKED=1 PYTHONPATH=$PWD \
      .venvs/airflow/bin/python bench/orchestration_vs_astro.py [--rounds 5] [--configs a,b,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster import ROOT, LocalCluster

STATE = Path("/tmp/orch-vs-astro")
RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"
DAGS = ROOT / "bench" / "dags_orchestration"
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")


@dataclass(frozen=True)
class Config:
    name: str
    side: str  # "astro" or "ours": which virtualenv and DAG folder
    dag_id: str
    first_task: str  # its start_date is the task start
    last_task: str  # its end_date is the task end
    poll: str  # for the table
    what: str


CONFIGS = [
    Config(
        "astro_default",
        "astro",
        "orch_astro_default",
        "submit_ray_job",
        "submit_ray_job",
        "60 s (its default)",
        "astro SubmitRayJob, trivial job",
    ),
    Config(
        "astro_poll5",
        "astro",
        "orch_astro_poll5",
        "submit_ray_job",
        "submit_ray_job",
        "5 s",
        "astro SubmitRayJob, trivial job",
    ),
    Config(
        "sensor_default",
        "ours",
        "orch_sensor_default",
        "submit_job",
        "wait_for_job",
        "60 s (poke_interval default)",
        "ours: submit task + RayJobSensor, trivial job",
    ),
    Config(
        "sensor_poll5",
        "ours",
        "orch_sensor_poll5",
        "submit_job",
        "wait_for_job",
        "5 s",
        "ours: submit task + RayJobSensor, trivial job",
    ),
    Config(
        "llm_default",
        "ours",
        "orch_llm_default",
        "classify_industry",
        "classify_industry",
        "paced (default; 1 s)",
        "ours: RayLLMBatchOperator, tiny model",
    ),
    Config(
        "llm_poll5",
        "ours",
        "orch_llm_poll5",
        "classify_industry",
        "classify_industry",
        "5 s",
        "ours: RayLLMBatchOperator, tiny model",
    ),
]

METRICS = [
    ("task_minus_job_s", "**task wall - job wall**"),
    ("minus_dags_test_start_s", 'task wall - job wall, less start_date -> "Task started"'),
    ("task_wall_s", "task wall"),
    ("job_wall_s", "job wall"),
    ("task_start_to_job_start_s", "task start -> job start"),
    ("task_start_to_code_s", '  of which start_date -> "Task started" (`dags test` starts the task)'),
    ("code_to_job_start_s", '  of which "Task started" -> job start (the task\'s code: import, submit)'),
    ("job_end_to_task_success_s", "job end -> task success"),
    ("job_end_to_trigger_completed_s", "job end -> trigger completed"),
    ("dags_test_process_s", "`dags test` process"),
]


def _utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _venv(side: str) -> Path:
    return ROOT / ".venvs" / ("astro" if side == "astro" else "airflow")


def _env(cluster: LocalCluster, side: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "RAY_")) and k != "PYTHONPATH"}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS / side),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    if side == "astro":
        # astro's RayHook reads the dashboard address and headers (a JSON string) from the extras.
        headers = json.dumps(cluster.auth_headers())
        env["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps(
            {"conn_type": "ray", "extra": {"address": cluster.address, "headers": headers}}
        )
    else:
        env["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection_json()
        env["PYTHONPATH"] = str(ROOT)  # this checkout's provider, as bench/run_cpu.sh does
    return env


def _template_db(cluster: LocalCluster, side: str) -> Path:
    home = STATE / f"template-{side}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    subprocess.run(
        [str(_venv(side) / "bin" / "airflow"), "db", "migrate"],
        env=_env(cluster, side, home),
        check=True,
        capture_output=True,
        timeout=600,
    )
    return home / "airflow.db"


def _prepare_model_and_data(rows: int) -> tuple[Path, Path]:
    model = STATE / "tiny-llama"
    if not (model / "config.json").exists():
        subprocess.run(
            [str(RAY_PYTHON), str(ROOT / "scripts" / "make_tiny_model.py"), str(model)], check=True
        )
    data = STATE / "customers.csv"
    script = ROOT / "scripts" / "make_sample_customers.py"
    command = [sys.executable, str(script), str(data), "--date", "2026-11-20", "--rows", str(rows)]
    subprocess.run(command, check=True, capture_output=True)
    return model, data


def _job_id(config: Config, db: sqlite3.Connection, run_id: str, log: str) -> str | None:
    if config.side == "astro":
        match = re.search(r"Submitted job with ID: (\S+)", log)
        return match.group(1) if match else None
    task, key = (
        ("submit_job", "return_value") if config.name.startswith("sensor") else (config.last_task, "job_id")
    )
    row = db.execute(
        "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND run_id = ? AND key = ?",
        (config.dag_id, task, run_id, key),
    ).fetchone()
    return json.loads(row[0]) if row else None


def _first_mark(log: str, pattern: str) -> float | None:
    for line in log.splitlines():
        match = _LOG_TIME.match(line)
        if match and re.search(pattern, line):
            return _utc(match.group(1))
    return None


def run_one(
    cluster: LocalCluster, config: Config, index: int, template: Path, llm: dict[str, str]
) -> dict[str, Any]:
    home = STATE / "runs" / f"{index:02d}-{config.name}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copy(template, home / "airflow.db")
    env = _env(cluster, config.side, home)
    command = [str(_venv(config.side) / "bin" / "airflow"), "dags", "test", config.dag_id, "2026-11-20"]
    if config.name.startswith("llm"):
        conf = {**llm, "output_uri": str(home / "output")}
        command += ["--conf", json.dumps(conf)]
    load_before = _load()
    t0 = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    t_exit = time.time()
    log = result.stdout + result.stderr
    (home / "dags_test.log").write_text(log)
    out: dict[str, Any] = {  # Any: JSON values
        "config": config.name,
        "round_index": index,
        "load_before": load_before,
        "load_after": _load(),
        "dags_test_process_s": t_exit - t0,
        "returncode": result.returncode,
        "log": str(home / "dags_test.log"),
    }
    with sqlite3.connect(home / "airflow.db") as db:
        rows = {
            task: (start, end, state, run_id)
            for task, start, end, state, run_id in db.execute(
                "SELECT task_id, start_date, end_date, state, run_id FROM task_instance WHERE dag_id = ?",
                (config.dag_id,),
            )
        }
        if config.first_task not in rows or config.last_task not in rows:
            out["error"] = f"task instances missing: {sorted(rows)}"
            return out
        start, _, _, run_id = rows[config.first_task]
        _, end, state, _ = rows[config.last_task]
        out["state"] = state
        job_id = _job_id(config, db, run_id, log)
    if state != "success" or not job_id:
        out["error"] = f"state={state} job_id={job_id}; see {home / 'dags_test.log'}"
        return out
    import httpx

    job = httpx.get(f"{cluster.address}/api/jobs/{job_id}", headers=cluster.auth_headers(), timeout=30).json()
    ti_start, ti_end = _utc(start), _utc(end)
    job_start, job_end = job["start_time"] / 1000, job["end_time"] / 1000
    trigger_done = _first_mark(log, r"\[DAG TEST\] Trigger completed")
    _split_start(out, log, ti_start, job_start)
    out.update(
        job_id=job_id,
        job_status=job["status"],
        job_start_epoch=job_start,
        job_end_epoch=job_end,
        task_wall_s=ti_end - ti_start,
        job_wall_s=job_end - job_start,
        task_minus_job_s=(ti_end - ti_start) - (job_end - job_start),
        task_start_to_job_start_s=job_start - ti_start,
        job_end_to_task_success_s=ti_end - job_end,
        job_end_to_trigger_completed_s=None if trigger_done is None else trigger_done - job_end,
    )
    if config.first_task != config.last_task:  # the sensor's own wait, beside the pair's
        sensor_start = _utc(rows[config.last_task][0])
        out["sensor_start_minus_job_start_s"] = sensor_start - job_start
        out["submit_task_wall_s"] = _utc(rows[config.first_task][1]) - ti_start
    return out


def _split_start(out: dict[str, Any], log: str, ti_start: float, job_start: float) -> None:  # Any: JSON
    """Split task start -> job start at the first task's "Task started" (Airflow's execution API, logged
    once the task's process has loaded the DAG file and is about to run its code)."""
    code_start = _first_mark(log, r"\] Task started ")
    if code_start is not None:
        out["task_start_to_code_s"] = code_start - ti_start
        out["code_to_job_start_s"] = job_start - code_start


def resummarize(path: Path) -> None:
    """Recompute the log-derived splits and the summary of a finished run's JSON (its logs and Airflow
    DBs still on disk under STATE/runs)."""
    result = json.loads(path.read_text())
    configs = [Config(**c) for c in result["configs"]]
    by_name = {c.name: c for c in configs}
    for run in result["runs"]:
        log = Path(run["log"])
        if "error" in run or not log.exists():
            continue
        with sqlite3.connect(log.parent / "airflow.db") as db:
            config = by_name[run["config"]]
            (start,) = db.execute(
                "SELECT start_date FROM task_instance WHERE dag_id = ? AND task_id = ?",
                (config.dag_id, config.first_task),
            ).fetchone()
        ti_start = _utc(start)
        _split_start(run, log.read_text(), ti_start, ti_start + run["task_start_to_job_start_s"])
    result["summary"], result["table"] = summarize(result["runs"], configs)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(
    runs: list[dict[str, Any]], configs: list[Config], metrics: list[tuple[str, str]] = METRICS
) -> tuple[dict[str, Any], str]:  # Any: JSON
    """Medians (min-max) of each metric per configuration, and the markdown table of them."""
    summary: dict[str, Any] = {}  # Any: JSON
    for run in runs:
        if run.get("task_start_to_code_s") is not None and run.get("task_minus_job_s") is not None:
            run["minus_dags_test_start_s"] = run["task_minus_job_s"] - run["task_start_to_code_s"]
    for config in configs:
        ok = [r for r in runs if r["config"] == config.name and "error" not in r]
        summary[config.name] = {
            key: _stats([r[key] for r in ok if r.get(key) is not None])
            for key, _ in metrics
            if any(r.get(key) is not None for r in ok)
        }
        summary[config.name]["failed_runs"] = sum(
            1 for r in runs if r["config"] == config.name and "error" in r
        )
    header = "| median (min-max), s | " + " | ".join(f"`{c.name}`" for c in configs) + " |"
    lines = [header, "|---|" + "---:|" * len(configs)]
    lines.append("| what | " + " | ".join(c.what for c in configs) + " |")
    lines.append("| poll | " + " | ".join(c.poll for c in configs) + " |")
    lines.append(
        "| runs ok / failed | "
        + " | ".join(
            f"{summary[c.name].get('task_minus_job_s', {}).get('n', 0)} / {summary[c.name]['failed_runs']}"
            for c in configs
        )
        + " |"
    )
    for key, label in metrics:
        cells = []
        for config in configs:
            s = summary[config.name].get(key)
            cells.append("-" if not s else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return summary, "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default=",".join(c.name for c in CONFIGS))
    parser.add_argument("--rows", type=int, default=50, help="customers for the llm_* runs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu_orchestration_vs_astro.json"))
    parser.add_argument("--dashboard-port", type=int, default=8465)
    parser.add_argument("--gcs-port", type=int, default=6590)
    parser.add_argument("--client-port", type=int, default=23201)
    parser.add_argument("--resummarize", metavar="JSON", help="recompute a finished run's splits and table")
    args = parser.parse_args()
    if args.resummarize:
        resummarize(Path(args.resummarize))
        return
    names = args.configs.split(",")
    configs = [c for c in CONFIGS if c.name in names]
    STATE.mkdir(parents=True, exist_ok=True)
    model, data = _prepare_model_and_data(args.rows)
    llm = {"model": str(model), "input_uri": str(data)}
    cluster = LocalCluster(
        state=STATE / "ray",
        dashboard_port=args.dashboard_port,
        gcs_port=args.gcs_port,
        client_port=args.client_port,
    )
    started = datetime.now(UTC)
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--short"], capture_output=True, text=True)
    versions = {}
    for side in ("astro", "ours"):
        probe = (
            "import importlib.metadata as m; import json; "
            "print(json.dumps({p: m.version(p) for p in ['apache-airflow', 'ray', 'astro-provider-ray', "
            "'apache-airflow-providers-cncf-kubernetes', 'airflow-provider-raybatch', 'httpx', 'aiohttp'] "
            "if any(d.metadata['Name'].lower() == p for d in m.distributions())}))"
        )
        answer = subprocess.run(
            [str(_venv(side) / "bin" / "python"), "-c", probe], capture_output=True, text=True
        )
        versions[side] = json.loads(answer.stdout or "{}")
    result: dict[str, Any] = {  # Any: JSON
        "date": started.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "node": platform.node(), "kernel": platform.release()},
        "command": " ".join(sys.argv),
        "git": git.stdout.strip(),
        "git_status_short": dirty.stdout.splitlines(),
        "versions": versions,
        "ray_head": {
            "dashboard": cluster.address,
            "gcs_port": args.gcs_port,
            "client_port": args.client_port,
        },
        "trivial_job": 'python -c "import time; time.sleep(20)"',
        "llm_rows": args.rows,
        "configs": [c.__dict__ for c in configs],
        "load_at_start": _load(),
        "runs": [],
    }
    out_path = Path(args.out)
    templates: dict[str, Path] = {}
    with cluster:
        for side in {c.side for c in configs}:
            templates[side] = _template_db(cluster, side)
            print(f"[orch {datetime.now():%H:%M:%S}] migrated the {side} template DB", flush=True)
        for index in range(args.rounds):
            for config in configs:
                run = run_one(cluster, config, index, templates[config.side], llm)
                result["runs"].append(run)
                shown = {k: round(v, 2) for k, v in run.items() if k.endswith("_s") and isinstance(v, float)}
                print(
                    f"[orch {datetime.now():%H:%M:%S}] round {index} {config.name}: "
                    f"{run.get('error') or shown} load {run['load_before']}",
                    flush=True,
                )
                result["summary"], result["table"] = summarize(result["runs"], configs)
                result["load_at_end"] = _load()
                out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print(f"[orch] wrote {out_path}")


if __name__ == "__main__":
    main()
