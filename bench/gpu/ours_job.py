"""(b) on the device: submit a job of bench/gpu/jobs/*.json to the local Ray head, wait, time its phases.

The body was built by the operator (bench/gpu/make_submissions.py). This does what RayHook does with
it: zip each package folder (``build_py_module_package``, the operator's own function), probe and
upload it through ``/api/packages/gcs/``, upload the generated packages (the ``raybatch_job`` package
holding the spec, byte for byte as the operator built it), check that every package the body's
``runtime_env`` ``py_modules`` names is in the cluster's store, POST ``/api/jobs/``, then poll
``/api/jobs/<id>`` (every 0.5 s here, while watching the staged parts) and read the job's logs and
the Ray state API.

Also measured (the scale jobs of issue 19; harmless on the others): the peak RSS of the driver and of
the Ray workers (bench/gpu/procmon.py, /proc every 0.5 s), the object store's spilling (``ray memory
--stats-only`` before and after, and the raylet's log), the parts staged (sidecars seen) and the files
the version holds, the phases outside the engine from the driver log (phases.scale_phases) and the
manifest's counts.

usage: python3 bench/gpu/ours_job.py bench/gpu/jobs/ours-2000.json OUT_JSON [DASHBOARD_URL | --direct]

``--direct`` is the fallback for a head whose dashboard did not start (no Jobs API): the same entrypoint
runs as a driver process of the cluster (RAY_ADDRESS=auto, the package on PYTHONPATH instead of
py_modules); the engine-ready time then comes from the driver log (vLLM's 1 s timestamps). The job
package is then unpacked into a folder put first on PYTHONPATH.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

import httpx  # noqa: E402
import phases  # noqa: E402
from procmon import ProcMonitor  # noqa: E402

from airflow_provider_raybatch.shared.manifest import manifest_from_log  # noqa: E402
from airflow_provider_raybatch.shared.packaging import (  # noqa: E402
    build_provider_package,
    build_py_module_package,
)

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
RAY = os.environ.get("RAY_CLI", "ray")


# -- submitting ------------------------------------------------------------------------------------


def _manifest_mtime(job: dict[str, Any]) -> float:  # Any: JSON.
    """When the job's manifest was written: the committed one, or a dry run's (pipeline/dry_run.py)."""
    spec = job["spec"]
    committed = Path(spec["output_uri"]) / "manifest.json"
    dry = Path(spec["output_uri"]) / "_dry_runs" / str(spec.get("run_key")) / "manifest.json"
    return (committed if committed.exists() or not dry.exists() else dry).stat().st_mtime


def client_for(address: str) -> tuple[httpx.Client, dict[str, str]]:
    # The device's head runs without auth (RAY_AUTH_MODE=disabled); RAY_TOKEN: a dry run on a token cluster.
    headers = {"Authorization": f"Bearer {os.environ['RAY_TOKEN']}"} if os.environ.get("RAY_TOKEN") else {}
    return httpx.Client(base_url=address, timeout=60, headers=headers), headers


def upload_packages(
    client: httpx.Client, job: dict[str, Any], body: dict[str, Any]
) -> list[str]:  # Any: JSON.
    """Upload the job's packages; ``body``'s py_modules then name them (every one checked to be there)."""
    uris = []
    for path in job["package_paths"]:
        # As the operator zips them (job_shipping.module_packages): our package whole, an author's filtered.
        ours = Path(path).name == "airflow_provider_raybatch"
        package = (build_provider_package if ours else build_py_module_package)(ROOT / path)
        if client.get(f"/api/packages/gcs/{package.name}").status_code == 404:
            client.put(f"/api/packages/gcs/{package.name}", content=package.data).raise_for_status()
        uris.append(package.uri)
    # The code zipped here replaces what the operator zipped where make_submissions.py ran (same
    # content-addressed function: the same URI when the trees agree).
    modules = body["runtime_env"]["py_modules"]
    body["runtime_env"]["py_modules"] = uris + modules[len(uris) :]
    for generated in job.get("generated_packages", []):
        name = generated["uri"].removeprefix("gcs://")
        if client.get(f"/api/packages/gcs/{name}").status_code == 404:
            data = base64.b64decode(generated["data_b64"])
            client.put(f"/api/packages/gcs/{name}", content=data).raise_for_status()
    missing = [
        uri
        for uri in body["runtime_env"]["py_modules"]
        if client.get(f"/api/packages/gcs/{uri.removeprefix('gcs://')}").status_code == 404
    ]
    if missing:
        sys.exit(
            f"py_modules not in the cluster's package store: {missing} (regenerate with make_submissions.py)"
        )
    return uris


def submit(client: httpx.Client, body: dict[str, Any]) -> str:  # Any: JSON.
    response = client.post("/api/jobs/", json=body)
    if response.status_code >= 400:
        sys.exit(f"POST /api/jobs/ -> {response.status_code}: {response.text[:2000]}")
    return response.json()["submission_id"]


def job_body(job: dict[str, Any], key: str = "body") -> dict[str, Any]:  # Any: JSON.
    body = json.loads(json.dumps(job[key]))
    if os.environ.get(
        "RAYBATCH_ENGINE_FORKSERVER"
    ):  # the A/B switch of pipeline/generate/engine.py, for the job
        env_vars = body["runtime_env"].setdefault("env_vars", {})
        env_vars["RAYBATCH_ENGINE_FORKSERVER"] = os.environ["RAYBATCH_ENGINE_FORKSERVER"]
    return body


def staging_of(job: dict[str, Any]) -> Path:  # Any: JSON.
    return Path(job["spec"]["output_uri"]) / "_staging" / job["spec"]["run_key"]


# -- what the job left behind ------------------------------------------------------------------------


def ray_memory_stats() -> dict[str, Any]:  # Any: JSON values.
    """``ray memory --stats-only``: the object store's cumulative spilled / restored bytes (head stays up)."""
    try:
        result = subprocess.run([RAY, "memory", "--stats-only"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    text = result.stdout
    out: dict[str, Any] = {"text": text[-3000:]}  # Any: JSON values.
    for key, pattern in (
        ("spilled", r"Spilled (\d+) MiB, (\d+) objects"),
        ("restored", r"Restored (\d+) MiB, (\d+) objects"),
    ):
        match = re.search(pattern, text)
        out[f"{key}_mib"], out[f"{key}_objects"] = (
            (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        )
    if result.returncode != 0:
        out["error"] = result.stderr[-1000:]
    return out


def raylet_spill_lines() -> list[str]:
    """The raylet's log lines about spilling (its own view; "Spilled ..." summaries)."""
    lines = []
    for log in Path("/tmp/ray/session_latest/logs").glob("raylet*.out"):
        with contextlib.suppress(OSError):
            lines += [line[:300] for line in log.read_text(errors="replace").splitlines() if "pill" in line]
    return lines[-20:]


def version_files(output_uri: str, manifest: dict[str, Any] | None) -> dict[str, Any]:  # Any: JSON values.
    """The files the committed version holds (outputs, errors, the rest) and what staging left."""
    out: dict[str, Any] = {}  # Any: JSON values.
    if manifest and manifest.get("version"):
        version = Path(output_uri) / "versions" / manifest["version"]
        for folder in ("outputs", "errors"):
            files = [p for p in (version / folder).glob("*") if p.is_file()]
            out[f"{folder}_files"] = len(files)
            out[f"{folder}_mib"] = round(sum(p.stat().st_size for p in files) / 2**20, 1)
        out["version_files_total"] = sum(1 for p in version.rglob("*") if p.is_file())
    staging = Path(output_uri) / "_staging"
    out["staging_files_left"] = sum(1 for p in staging.rglob("*") if p.is_file()) if staging.exists() else 0
    return out


def manifest_summary(manifest: dict[str, Any] | None) -> dict[str, Any]:  # Any: JSON values.
    keys = (
        "rows_in",
        "rows_out",
        "rows_failed",
        "rows_duplicate",
        "rows_resumed",
        "errors_by_reason",
        "tokens_in",
        "tokens_out",
        "wall_seconds",
        "started_at",
        "finished_at",
        "version",
        "generated_text_counts",
        "failed_rows_check",
        "versions",
    )
    return {key: manifest.get(key) for key in keys} if manifest else {}


def scale_extras(
    job: dict[str, Any],  # Any: JSON values.
    logs: str,
    t_submit: float,
    job_start: float,
    job_end: float,
    parts: list[dict[str, Any]],  # Any: JSON values.
    manifest: dict[str, Any] | None,  # Any: JSON values.
) -> dict[str, Any]:  # Any: JSON values.
    output = Path(job["spec"]["output_uri"])
    try:
        manifest_mtime: float | None = _manifest_mtime(job)  # the committed one or a dry run's
    except FileNotFoundError:
        manifest_mtime = None
    report_mtime = None
    if manifest and manifest.get("version"):
        report = output / "versions" / manifest["version"] / "report.html"
        report_mtime = report.stat().st_mtime if report.exists() else None
    phase = phases.scale_phases(logs, t_submit, job_start, job_end, parts, manifest_mtime, report_mtime)
    rows_in = (manifest or {}).get("rows_in")
    wall = (manifest_mtime - t_submit) if manifest_mtime else None
    running = [(int(r), int(w)) for r, w in re.findall(r"Running: (\d+) reqs, Waiting: (\d+) reqs", logs)]
    return {
        "phases": phase,
        "wall_s": wall,
        # vLLM's own stats lines from the replica (every ~5-10 s): is the engine kept busy?
        "engine_running_reqs": _quantiles([r for r, _ in running]),
        "engine_waiting_reqs": _quantiles([w for _, w in running]),
        "rows_per_s_end_to_end": rows_in / wall if rows_in and wall else None,
        "rows_per_s_generating": (
            phase["engine_part_rows"] / phase["first_to_last_part_s"]
            if phase.get("first_to_last_part_s")
            else None
        ),
        "parts_staged": len(parts),
        "part_files_written": sum(p.get("files", 0) for p in parts) + len(parts),  # data files + sidecars
        "part_rows": {
            "min": min((p["rows"] for p in parts), default=None),
            "max": max((p["rows"] for p in parts), default=None),
        },
        "files": version_files(job["spec"]["output_uri"], manifest),
        "manifest": manifest_summary(manifest),
    }


def _quantiles(values: list[int]) -> dict[str, Any] | None:  # Any: JSON values.
    if not values:
        return None
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


def wait_for(
    client: httpx.Client, job_id: str, staging: Path, on_poll: Any = None, known: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # Any: JSON.
    def info() -> dict[str, Any]:  # Any: JSON.
        for _ in range(10):
            try:
                return client.get(f"/api/jobs/{job_id}").json()
            except httpx.HTTPError:
                time.sleep(1)
        return client.get(f"/api/jobs/{job_id}").json()

    parts = phases.watch_parts(lambda: info()["status"] in TERMINAL, staging, on_poll=on_poll, known=known)
    return parts, info()


def job_logs(client: httpx.Client, job_id: str) -> str:
    return client.get(f"/api/jobs/{job_id}/logs").json().get("logs", "")


# -- the modes ------------------------------------------------------------------------------------------


def direct(job: dict[str, Any], out: Path) -> None:  # Any: JSON.
    staging = staging_of(job)
    package_dir = Path(tempfile.mkdtemp(prefix="raybatch-job-"))
    for generated in job.get("generated_packages", []):
        zipfile.ZipFile(io.BytesIO(base64.b64decode(generated["data_b64"]))).extractall(package_dir)
    env = {
        **os.environ,
        "RAY_ADDRESS": "auto",
        "PYTHONPATH": f"{package_dir}:{ROOT}:{os.environ.get('PYTHONPATH', '')}",
    }
    t_submit = time.time()
    with ProcMonitor() as monitor, out.with_suffix(".log").open("w") as stream:
        process = subprocess.Popen(
            shlex.split(job["body"]["entrypoint"]), env=env, stdout=stream, stderr=subprocess.STDOUT
        )
        parts = phases.watch_parts(lambda: process.poll() is not None, staging)
    t_end = time.time()
    logs = out.with_suffix(".log").read_text()
    if process.returncode != 0:
        print(logs[-5000:])
        sys.exit(f"driver exited {process.returncode}")
    manifest = manifest_from_log(logs)
    result = phases.ours_result(
        t_submit=t_submit,
        t_submitted=t_submit,
        job_start=t_submit,
        job_end=t_end,
        manifest=manifest,
        manifest_mtime=_manifest_mtime(job),
        logs=logs,
        tasks=[],
        parts=parts,
    )
    result.update(name=job["name"], mode="direct driver (no Jobs API)", rss=monitor.report())
    result.update(scale_extras(job, logs, t_submit, t_submit, t_end, parts, manifest))
    out.write_text(json.dumps(result, indent=1))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    if sys.argv[3:4] == ["--direct"]:
        return direct(job, out)
    address = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:8265"
    client, headers = client_for(address)
    body = job_body(job)
    staging = staging_of(job)
    memory_before = ray_memory_stats()

    t_submit = time.time()
    uris = upload_packages(client, job, body)
    job_id = submit(client, body)
    t_submitted = time.time()
    print(
        f"submitted {job_id} in {t_submitted - t_submit:.2f} s "
        f"(packages {body['runtime_env']['py_modules']}; "
        f"code zipped here {uris}, where the jobs were made {job['package_uris_here']})",
        flush=True,
    )
    progress = {"next": time.time() + 60}

    def report_progress(parts: dict[str, Any]) -> None:  # Any: JSON.
        if time.time() >= progress["next"]:
            progress["next"] += 60
            rows = sum(p["rows"] for p in parts.values())
            print(f"  {time.time() - t_submit:6.0f} s: {len(parts)} parts, {rows} rows staged", flush=True)

    with ProcMonitor() as monitor:
        parts, details = wait_for(client, job_id, staging, on_poll=report_progress)
    logs = job_logs(client, job_id)
    out.with_suffix(".log").write_text(logs)
    if details["status"] != "SUCCEEDED":
        print(logs[-5000:])
        out.with_suffix(".failed.json").write_text(
            json.dumps({"details": details, "rss": monitor.report()}, indent=1)
        )
        sys.exit(f"job {job_id} {details['status']}: {details.get('message')}")
    try:
        tasks = phases.creation_tasks(address, headers)
    except Exception as err:  # noqa: BLE001 - the state API is a nicety here; keep the run's result
        print(f"state API: {type(err).__name__}: {err}", flush=True)
        tasks = []
    manifest = manifest_from_log(logs)
    result = phases.ours_result(
        t_submit=t_submit,
        t_submitted=t_submitted,
        job_start=details["start_time"] / 1000,
        job_end=details["end_time"] / 1000,
        manifest=manifest,
        manifest_mtime=_manifest_mtime(job),
        logs=logs,
        tasks=tasks,
        parts=parts,
    )
    result.update(name=job["name"], job_id=job_id, actor_creation_tasks=tasks, rss=monitor.report())
    result.update(
        scale_extras(
            job, logs, t_submit, details["start_time"] / 1000, details["end_time"] / 1000, parts, manifest
        )
    )
    memory_after = ray_memory_stats()
    result["object_store"] = {
        "spilled_mib_this_job": memory_after.get("spilled_mib", 0) - memory_before.get("spilled_mib", 0),
        "spilled_objects_this_job": memory_after.get("spilled_objects", 0)
        - memory_before.get("spilled_objects", 0),
        "restored_mib_this_job": memory_after.get("restored_mib", 0) - memory_before.get("restored_mib", 0),
        "ray_memory_after": memory_after,
        "raylet_spill_lines": raylet_spill_lines(),
    }
    out.write_text(json.dumps(result, indent=1))
    print(
        "RESULT "
        + json.dumps(
            {
                k: v
                for k, v in result.items()
                if k not in ("actor_creation_tasks", "rss", "phases", "object_store", "manifest")
            }
        ),
        flush=True,
    )
    print("PHASES " + json.dumps({k: v for k, v in result["phases"].items() if k != "datasets"}), flush=True)
    print(
        "RSS "
        + json.dumps(
            {g: (v["peak_rss_mib"], v["peak_sum_rss_mib"]) for g, v in result["rss"]["groups"].items()}
        ),
        flush=True,
    )
    print(
        f"SPILLED {result['object_store']['spilled_mib_this_job']} MiB; MANIFEST "
        + json.dumps(result["manifest"])[:1500],
        flush=True,
    )


if __name__ == "__main__":
    main()
