"""(b) on the device: submit a job of bench/gpu/jobs/*.json to the local Ray head, wait, time its phases.

The body was built by the operator (bench/gpu/make_submissions.py). This does what RayHook does with
it: zip each package folder (``build_py_module_package``, the operator's own function), probe and
upload it through ``/api/packages/gcs/``, POST ``/api/jobs/``, then poll ``/api/jobs/<id>`` (every
0.5 s here, while watching the staged parts) and read the job's logs and the Ray state API.

usage: python3 bench/gpu/ours_job.py bench/gpu/jobs/ours-2000.json OUT_JSON [DASHBOARD_URL | --direct]

``--direct`` is the fallback for a head whose dashboard did not start (no Jobs API): the same entrypoint
runs as a driver process of the cluster (RAY_ADDRESS=auto, the package on PYTHONPATH instead of
py_modules); the engine-ready time then comes from the driver log (vLLM's 1 s timestamps).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
import phases  # noqa: E402

from airflow_provider_raybatch.manifest import manifest_from_log  # noqa: E402
from airflow_provider_raybatch.utils.packaging import build_py_module_package  # noqa: E402

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def direct(job: dict, out: Path) -> None:
    staging = Path(job["spec"]["output_uri"]) / "_staging" / job["spec"]["run_key"]
    env = {**os.environ, "RAY_ADDRESS": "auto", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    t_submit = time.time()
    with out.with_suffix(".log").open("w") as stream:
        process = subprocess.Popen(
            shlex.split(job["body"]["entrypoint"]), env=env, stdout=stream, stderr=subprocess.STDOUT
        )
        parts = phases.watch_parts(lambda: process.poll() is not None, staging)
    t_end = time.time()
    logs = out.with_suffix(".log").read_text()
    if process.returncode != 0:
        print(logs[-5000:])
        sys.exit(f"driver exited {process.returncode}")
    result = phases.ours_result(
        t_submit=t_submit,
        t_submitted=t_submit,
        job_start=t_submit,
        job_end=t_end,
        manifest=manifest_from_log(logs),
        manifest_mtime=(Path(job["spec"]["output_uri"]) / "manifest.json").stat().st_mtime,
        logs=logs,
        tasks=[],
        parts=parts,
    )
    result.update(name=job["name"], mode="direct driver (no Jobs API)")
    out.write_text(json.dumps(result, indent=1))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    if sys.argv[3:4] == ["--direct"]:
        return direct(job, out)
    address = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:8265"
    # The device's head runs without auth (RAY_AUTH_MODE=disabled); RAY_TOKEN: a dry run on a token cluster.
    headers = {"Authorization": f"Bearer {os.environ['RAY_TOKEN']}"} if os.environ.get("RAY_TOKEN") else {}
    client = httpx.Client(base_url=address, timeout=30, headers=headers)
    body = json.loads(json.dumps(job["body"]))
    if os.environ.get("RAYBATCH_ENGINE_FORKSERVER"):  # the A/B switch of pipeline/engine.py, for the job
        env_vars = body["runtime_env"].setdefault("env_vars", {})
        env_vars["RAYBATCH_ENGINE_FORKSERVER"] = os.environ["RAYBATCH_ENGINE_FORKSERVER"]
    staging = Path(job["spec"]["output_uri"]) / "_staging" / job["spec"]["run_key"]

    t_submit = time.time()
    uris = []
    for path in job["package_paths"]:
        package = build_py_module_package(ROOT / path)
        probe = client.get(f"/api/packages/gcs/{package.name}")
        if probe.status_code == 404:
            client.put(f"/api/packages/gcs/{package.name}", content=package.data).raise_for_status()
        uris.append(package.uri)
    body["runtime_env"]["py_modules"] = uris + body["runtime_env"]["py_modules"][len(uris) :]
    response = client.post("/api/jobs/", json=body)
    response.raise_for_status()
    job_id = response.json()["submission_id"]
    t_submitted = time.time()
    print(
        f"submitted {job_id} in {t_submitted - t_submit:.2f} s (packages {uris}; "
        f"built here {job['package_uris_here']})",
        flush=True,
    )

    def info() -> dict:
        return client.get(f"/api/jobs/{job_id}").json()

    parts = phases.watch_parts(lambda: info()["status"] in TERMINAL, staging)
    details = info()
    logs = client.get(f"/api/jobs/{job_id}/logs").json().get("logs", "")
    out.with_suffix(".log").write_text(logs)
    if details["status"] != "SUCCEEDED":
        print(logs[-5000:])
        sys.exit(f"job {job_id} {details['status']}: {details.get('message')}")
    tasks = phases.creation_tasks(address, headers)
    result = phases.ours_result(
        t_submit=t_submit,
        t_submitted=t_submitted,
        job_start=details["start_time"] / 1000,
        job_end=details["end_time"] / 1000,
        manifest=manifest_from_log(logs),
        manifest_mtime=(Path(job["spec"]["output_uri"]) / "manifest.json").stat().st_mtime,
        logs=logs,
        tasks=tasks,
        parts=parts,
    )
    result.update(name=job["name"], job_id=job_id, actor_creation_tasks=tasks)
    out.write_text(json.dumps(result, indent=1))
    print(
        "RESULT " + json.dumps({k: v for k, v in result.items() if k != "actor_creation_tasks"}), flush=True
    )


if __name__ == "__main__":
    main()
