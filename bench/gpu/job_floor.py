"""Issue 48 point 3: what any design that keeps one Ray job per task pays before its driver does work.

A warm pool job's first row came 11-16 s after its submit (RESULTS.md 17). Part of that is ours (reading,
preparing, the engine stage's start) and part is Ray's Jobs API: the job supervisor, the runtime env,
a driver process, ``import ray`` and ``ray.init``. This submits probe jobs whose driver prints one time
stamp and ends, through the same ``POST /api/jobs/`` the hook uses, and reports submit to stamp:

* ``bare``: ``python -c 'print(time)'``, no runtime env (the supervisor and a Python process);
* ``env``: the same with the runtime env of a real job of ours (its ``py_modules``, uploaded first as
  ``ours_job.py`` uploads them; after the first run they are unpacked on the node, as for a warm job);
* ``ray_init``: that runtime env, then ``import ray; ray.init()`` before the stamp;
* ``our_driver``: that runtime env, then what our entrypoint does before it reads a row
  (``pipeline/__main__.py``: the spec read from the job package, ``ray.init``, the warm workers asked
  for, ``pipeline.run`` imported: Ray Data and the engine stages).

The best of these is the least a job per task can reach; the ``<= 3 s`` target needs the first rows to
start somewhere already running (RESULTS.md 19).

usage: python3 bench/gpu/job_floor.py bench/gpu/jobs/NAME.json OUT_JSON [REPEATS] [DASHBOARD_URL]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from ours_job import TERMINAL, client_for, job_body, job_logs, submit, upload_packages  # noqa: E402

STAMP = "FLOOR_STAMP"
_PRINT = f"import time; print('{STAMP}', time.time(), flush=True)"
_OUR_DRIVER = (
    "import sys; from airflow_provider_raybatch.pipeline.__main__ import shipped_spec; "
    "spec = shipped_spec(sys.argv[1]); import ray; ray.init(); "
    "from airflow_provider_raybatch.pipeline import worker_warmup; "
    "worker_warmup.start(worker_warmup.configured_workers(worker_warmup.replicas_of(spec))); "
    "import airflow_provider_raybatch.pipeline.run; " + _PRINT
)
PROBES: dict[str, tuple[str, bool]] = {  # name: (python code, with the job's runtime env)
    "bare": (_PRINT, False),
    "env": (_PRINT, True),
    "ray_init": ("import ray; ray.init(); " + _PRINT, True),
    "our_driver": (_OUR_DRIVER, True),
}


def _fingerprint(entrypoint: str) -> str:
    return entrypoint.rsplit(" ", 1)[-1]


def run_probe(
    client: httpx.Client, code: str, runtime_env: dict[str, object] | None, argument: str
) -> dict[str, float]:
    body: dict[str, object] = {"entrypoint": f'python -c "{code}" {argument}'}
    if runtime_env is not None:
        body["runtime_env"] = runtime_env
    t_post = time.time()
    job_id = submit(client, body)
    while (details := client.get(f"/api/jobs/{job_id}").json())["status"] not in TERMINAL:
        time.sleep(0.1)
    logs = job_logs(client, job_id)
    stamps = [float(line.split()[1]) for line in logs.splitlines() if line.startswith(STAMP)]
    if details["status"] != "SUCCEEDED" or not stamps:
        sys.exit(f"probe {job_id} {details['status']}: {logs[-3000:]}")
    return {
        "submit_to_stamp_s": round(stamps[0] - t_post, 3),
        "submit_to_job_start_s": round(details["start_time"] / 1000 - t_post, 3),
        "submit_to_job_end_s": round(details["end_time"] / 1000 - t_post, 3),
    }


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    client, _ = client_for(sys.argv[4] if len(sys.argv) > 4 else "http://127.0.0.1:8265")
    body = job_body(job)
    upload_packages(client, job, body)
    runtime_env = body["runtime_env"]
    argument = _fingerprint(body["entrypoint"])
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):  # interleaved, so a slow minute of the host touches every probe alike
        for name, (code, with_env) in PROBES.items():
            results.setdefault(name, []).append(
                run_probe(client, code, runtime_env if with_env else None, argument)
            )
    summary = {
        name: {
            "median_submit_to_stamp_s": statistics.median(r["submit_to_stamp_s"] for r in runs),
            "min_submit_to_stamp_s": min(r["submit_to_stamp_s"] for r in runs),
            "runs": runs,
        }
        for name, runs in results.items()
    }
    out.write_text(json.dumps({"job": job["name"], "repeats": repeats, "probes": summary}, indent=1))
    print(f"{'probe':<12} {'median s':>9} {'min s':>7}  submit to the driver's stamp ({repeats} runs each)")
    for name, row in summary.items():
        print(f"{name:<12} {row['median_submit_to_stamp_s']:>9.2f} {row['min_submit_to_stamp_s']:>7.2f}")


if __name__ == "__main__":
    main()
