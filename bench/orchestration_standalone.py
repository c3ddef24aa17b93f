"""Issue 20 point 3 under a real Airflow: task wall minus Ray job wall with ``airflow standalone``.

bench/orchestration_vs_astro.py measures it under ``airflow dags test``, whose in-process API server
puts 3.3-3.5 s between a task's ``start_date`` and its code (bench/RESULTS.md section 11) that no
deployment has. Here each side runs as it would be deployed: ``airflow standalone`` (scheduler with
LocalExecutor, triggerer, dag processor, API server; SQLite), ours from .venvs/airflow and
astro-provider-ray 0.4.0 from .venvs/astro, both up at once on ports of their own, one Ray head
(bench/cluster.py) shared. Runs are triggered through the REST API one at a time, the configurations
interleaved round by round (A B C ..., A B C ...):

  llm_worker      ours: RayLLMBatchOperator on the tiny model, every setting at its default (it waits
                  in its worker: Airflow's default_deferrable is False; paced polls, 1 s)
  llm_default     the same, deferrable=True (the triggerer waits; default pace)
  sensor_poll5    ours: a task submits the trivial job (RayHook), RayJobSensor (deferrable) waits, 5 s
  astro_poll5     astro SubmitRayJob (always deferred) on the same trivial job, poll_interval=5
  astro_default   the same at its default poll_interval (60 s)

For each run, from the REST API (task instances) and the Jobs API (the run's Ray job): task wall (the
first task's start_date -> the last task's end_date), the Ray job's wall (start_time -> end_time), task
start -> job start, and job end -> task success. Prints a markdown table of medians (min-max) and writes
JSON after every run.

usage (under the Ray lock, as bench/run_cpu.sh runs the other benchmarks):
  flock /tmp/raybatch-ray.lock env RAYBATCH_BENCH_LOCKED=1 PYTHONPATH=$PWD \\
      .venvs/airflow/bin/python bench/orchestration_standalone.py [--rounds 5] [--configs a,b,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from cluster import ROOT, LocalCluster, require_lock
from orchestration_vs_astro import CONFIGS as DAGS_TEST_CONFIGS
from orchestration_vs_astro import METRICS as DAGS_TEST_METRICS
from orchestration_vs_astro import Config, _env, _load, _prepare_model_and_data, _venv, summarize

STATE = Path("/tmp/orch-standalone")
API_PORTS = {"ours": 8471, "astro": 8472}
#: Each standalone's scheduler and triggerer serve their logs on ports of their own (Airflow's 8793 and
#: 8794 by default: two instances at once would collide).
LOG_SERVER_PORTS = {"ours": (8481, 8482), "astro": (8483, 8484)}
TERMINAL = {"success", "failed"}

_FROM_DAGS_TEST = ("llm_default", "sensor_poll5", "astro_poll5", "astro_default")
CONFIGS = [
    Config(
        "llm_worker",
        "ours",
        "orch_llm_worker",
        "classify_industry",
        "classify_industry",
        "paced (default; 1 s)",
        "ours: RayLLMBatchOperator, all defaults (waits in its worker)",
    ),
    *[c for c in DAGS_TEST_CONFIGS if c.name in _FROM_DAGS_TEST],
]

_SAME_METRICS = (
    "task_minus_job_s",
    "task_wall_s",
    "job_wall_s",
    "task_start_to_job_start_s",
    "job_end_to_task_success_s",
)
#: The dags-test benchmark's metrics that mean the same here, and two of a real scheduler's own.
METRICS = [
    *[m for m in DAGS_TEST_METRICS if m[0] in _SAME_METRICS],
    ("queued_to_start_s", "first task queued -> started (before the task wall)"),
    ("run_wall_s", "DAG run start -> end"),
]


@dataclass(frozen=True)
class Instance:
    """One ``airflow standalone``, reached through its REST API (all users admins: no login)."""

    side: str
    url: str
    home: Path

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:  # Any: httpx's arguments
        """One REST call; a 5xx (SQLite busy under the scheduler) is tried again twice."""
        for attempt in range(3):
            response = httpx.request(method, f"{self.url}/api/v2{path}", timeout=30, **kwargs)
            if response.status_code < 500 or attempt == 2:
                break
            time.sleep(1)
        response.raise_for_status()
        return response


@contextmanager
def standalone(cluster: LocalCluster, side: str, dag_ids: set[str]) -> Iterator[Instance]:
    """Start ``airflow standalone`` for ``side``; yield it once its API lists ``dag_ids``; stop it."""
    home = STATE / f"airflow-{side}"
    subprocess.run(["rm", "-rf", str(home)], check=True)
    home.mkdir(parents=True)
    port = API_PORTS[side]
    bin_dir = _venv(side) / "bin"
    env = {
        **_env(cluster, side, home),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",  # standalone starts `airflow` subcommands
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # a local bench instance: no login
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(LOG_SERVER_PORTS[side][0]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(LOG_SERVER_PORTS[side][1]),
    }
    with (home / "standalone.log").open("w") as log:
        process = subprocess.Popen(
            [str(bin_dir / "airflow"), "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=home,
        )
        instance = Instance(side, f"http://127.0.0.1:{port}", home)
        try:
            deadline = time.monotonic() + 300
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    dags = instance.api("GET", "/dags", params={"limit": 100}).json()["dags"]
                    if dag_ids <= {d["dag_id"] for d in dags}:
                        break
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{side}: standalone not ready; see {home / 'standalone.log'}")
                time.sleep(2)
            for dag_id in dag_ids:
                instance.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
            yield instance
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def _epoch(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def _ray_jobs(cluster: LocalCluster) -> list[dict[str, Any]]:  # Any: Ray's JSON
    answer = httpx.get(f"{cluster.address}/api/jobs/", headers=cluster.auth_headers(), timeout=30)
    answer.raise_for_status()
    return answer.json()


def run_one(
    cluster: LocalCluster, instance: Instance, config: Config, index: int, llm: dict[str, str]
) -> dict[str, Any]:  # Any: JSON values
    day = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=index)
    output = STATE / "outputs" / f"{index:02d}-{config.name}"
    conf = {**llm, "output_uri": str(output)} if config.name.startswith("llm") else {}
    seen = {job["submission_id"] for job in _ray_jobs(cluster)}
    load_before = _load()
    body = {"logical_date": day.isoformat().replace("+00:00", "Z"), "conf": conf}
    run_id = instance.api("POST", f"/dags/{config.dag_id}/dagRuns", json=body).json()["dag_run_id"]
    run_path = f"/dags/{config.dag_id}/dagRuns/{quote(run_id)}"
    deadline = time.monotonic() + 900
    while (run := instance.api("GET", run_path).json())["state"] not in TERMINAL:
        if time.monotonic() > deadline:
            return {
                "config": config.name,
                "round_index": index,
                "error": f"run {run_id} still {run['state']}",
            }
        time.sleep(0.5)
    tis = {
        task: instance.api("GET", f"{run_path}/taskInstances/{task}").json()
        for task in {config.first_task, config.last_task}
    }
    out: dict[str, Any] = {  # Any: JSON values
        "config": config.name,
        "round_index": index,
        "run_id": run_id,
        "load_before": load_before,
        "load_after": _load(),
        "state": run["state"],
        "task_states": {task: ti["state"] for task, ti in tis.items()},
        "tries": {task: ti["try_number"] for task, ti in tis.items()},
    }
    jobs = [job for job in _ray_jobs(cluster) if job["submission_id"] not in seen]
    if run["state"] != "success" or len(jobs) != 1:
        out["error"] = f"run {run['state']}, new Ray jobs {[j['submission_id'] for j in jobs]}"
        return out
    (job,) = jobs
    first, last = tis[config.first_task], tis[config.last_task]
    ti_start, ti_end = _epoch(first["start_date"]), _epoch(last["end_date"])
    queued = _epoch(first.get("queued_when"))
    job_start, job_end = job["start_time"] / 1000, job["end_time"] / 1000
    assert ti_start is not None and ti_end is not None
    out.update(
        job_id=job["submission_id"],
        job_status=job["status"],
        task_wall_s=ti_end - ti_start,
        job_wall_s=job_end - job_start,
        task_minus_job_s=(ti_end - ti_start) - (job_end - job_start),
        task_start_to_job_start_s=job_start - ti_start,
        job_end_to_task_success_s=ti_end - job_end,
        queued_to_start_s=None if queued is None else ti_start - queued,
        run_wall_s=(_epoch(run["end_date"]) or 0) - (_epoch(run["start_date"]) or 0),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default=",".join(c.name for c in CONFIGS))
    parser.add_argument("--rows", type=int, default=20, help="customers for the llm_* runs")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "cpu_orchestration_standalone.json")
    )
    args = parser.parse_args()
    require_lock()
    configs = [c for c in CONFIGS if c.name in args.configs.split(",")]
    STATE.mkdir(parents=True, exist_ok=True)
    model, data = _prepare_model_and_data(args.rows)
    llm = {"model": str(model), "input_uri": str(data)}
    cluster = LocalCluster(state=STATE / "ray", dashboard_port=8475, gcs_port=6600, client_port=23211)
    git = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    result: dict[str, Any] = {  # Any: JSON
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "node": platform.node(), "kernel": platform.release()},
        "command": " ".join(sys.argv),
        "git": git.stdout.strip(),
        "runner": "airflow standalone (LocalExecutor, SQLite), one per side, both up at once",
        "llm_rows": args.rows,
        "configs": [c.__dict__ for c in configs],
        "load_at_start": _load(),
        "runs": [],
    }
    out_path = Path(args.out)
    with cluster, ExitStack() as stack:
        instances = {
            side: stack.enter_context(
                standalone(cluster, side, {c.dag_id for c in configs if c.side == side})
            )
            for side in sorted({c.side for c in configs})
        }
        print(f"[orch {datetime.now():%H:%M:%S}] standalone up: {sorted(instances)}", flush=True)
        for index in range(args.rounds):
            for config in configs:
                run = run_one(cluster, instances[config.side], config, index, llm)
                result["runs"].append(run)
                shown = {k: round(v, 2) for k, v in run.items() if k.endswith("_s") and isinstance(v, float)}
                print(
                    f"[orch {datetime.now():%H:%M:%S}] round {index} {config.name}: "
                    f"{run.get('error') or shown} load {run.get('load_before', '?')}",
                    flush=True,
                )
                result["summary"], result["table"] = summarize(result["runs"], configs, METRICS)
                result["load_at_end"] = _load()
                out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print(f"[orch] wrote {out_path}")


if __name__ == "__main__":
    main()
