"""The pre-engine path at scale: a dry run (``dry_run=True``) over N generated customer rows.

Everything a real run does before the engine: read the CSV files, prepare each row, find duplicate
ids (above 1,000,000 rows in hash partitions on the cluster, pipeline/read/dedupe.py), render every
prompt with the model's chat template and count its tokens. The input is the seeds' customers CSV shape
(scripts/make_sample_customers.py) in files of ``--rows-per-file`` rows, with 1% of the rows
repeating an earlier Customer Id and 0.5% without one; the prompt is the example DAG's
company-industry prompt.

Reported: wall (job start to end), rows/s, the driver's peak RSS (sampled every 0.5 s from /proc),
the object store's spilled bytes (``ray memory --stats-only``), and the dry run's counts, which
must add up (rows in = would reach the engine + would fail; duplicates and bad rows as generated).

usage (under the Ray lock, as bench/run_cpu.sh does):
  flock /tmp/raybatch-ray.lock env RAYBATCH_BENCH_LOCKED=1 .venvs/airflow/bin/python bench/prepath.py \
      --rows 20000000 --out bench/results/prepath_20m.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from cluster import LocalCluster  # noqa: E402
from make_sample_customers import write_customer_files  # noqa: E402

RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"
INDUSTRIES = [
    "Technology",
    "Healthcare",
    "Finance",
    "Retail",
    "Manufacturing",
    "Real Estate",
    "Food",
    "Other",
]
DUPLICATE_EVERY = 100  # 1% of rows repeat an earlier row's Customer Id
NO_ID_EVERY = 200  # 0.5% of rows have an empty Customer Id: error rows ("missing id")


def log(message: str) -> None:
    print(f"[prepath {datetime.now():%H:%M:%S}] {message}", flush=True)


def write_input(folder: Path, rows: int, rows_per_file: int) -> tuple[int, int]:
    """Write the CSV files (reused when the folder holds this size already); (duplicates, bad rows)."""
    marker = folder / "params.json"
    params = {
        "rows": rows,
        "rows_per_file": rows_per_file,
        "duplicate_every": DUPLICATE_EVERY,
        "no_id_every": NO_ID_EVERY,
    }
    if marker.exists() and json.loads(marker.read_text()).get("params") == params:
        return tuple(json.loads(marker.read_text())["counts"])
    for old in folder.glob("*.csv"):
        old.unlink()
    counts = write_customer_files(folder, rows, rows_per_file, DUPLICATE_EVERY, NO_ID_EVERY)
    marker.write_text(json.dumps({"params": params, "counts": counts}))
    return counts


class DriverRss:
    """Samples the peak resident memory of the job's driver (the process running the pipeline module)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DriverRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            for process in psutil.process_iter(["cmdline", "memory_info"]):
                cmdline = " ".join(process.info["cmdline"] or [])
                if "airflow_provider_raybatch.pipeline" in cmdline and process.info["memory_info"]:
                    self.peak_bytes = max(self.peak_bytes, process.info["memory_info"].rss)


def spilled_bytes(cluster: LocalCluster) -> int | None:
    """Bytes the object store spilled to disk so far, from ``ray memory --stats-only``."""
    address = f"127.0.0.1:{cluster.gcs_port}"
    command = [str(RAY_PYTHON.parent / "ray"), "memory", "--stats-only", "--address", address]
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(cluster.state / "auth_token")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ, **token})
    for line in result.stdout.splitlines():
        if line.strip().startswith("Spilled"):
            return int(float(line.split()[1]) * 1024 * 1024)  # "Spilled 1234 MiB, ..."
    if result.returncode != 0:
        log(f"ray memory failed: {result.stderr[-500:]}")
        return None
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--rows-per-file", type=int, default=1_000_000)
    parser.add_argument("--data", type=Path, default=Path("/tmp/raybatch-prepath"))
    parser.add_argument(
        "--driver-scan-max-rows",
        type=int,
        default=None,
        help="RAYBATCH_DRIVER_SCAN_MAX_ROWS for the job (default: the pipeline's 1,000,000)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prepath.json")
    args = parser.parse_args()

    from airflow_provider_raybatch.hooks.ray import RayHook
    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
    from airflow_provider_raybatch.shared.manifest import manifest_from_log

    input_dir = args.data / f"in-{args.rows}"
    t0 = time.time()
    duplicates, bad = write_input(input_dir, args.rows, args.rows_per_file)
    log(f"input: {args.rows:,} rows in {input_dir} ({time.time() - t0:.0f} s to write or reuse)")
    model = args.data / "model"
    if not (model / "config.json").exists():
        subprocess.run(
            [str(RAY_PYTHON), str(ROOT / "scripts" / "make_tiny_model.py"), str(model)], check=True
        )
    output_uri = str(args.data / f"out-{uuid.uuid4().hex[:8]}")
    operator = RayLLMBatchOperator(
        task_id="classify_industry",
        model=str(model),
        input_uri=str(input_dir),
        output_uri=output_uri,
        input_format="csv",
        system_prompt="You classify companies by industry. Answer with the label only.",
        user_template="What industry is this company in: {Company}",
        sampling_params={"temperature": 0, "max_tokens": 16, "structured_outputs": {"choice": INDUSTRIES}},
        id_column="Customer Id",
        keep_columns=["Company", "Country"],
        batch_size=64,
        dry_run=True,
        dry_run_rows_per_second=1000.0,
        max_failed_fraction=1.0,
        runtime_env={"env_vars": {"RAYBATCH_DRIVER_SCAN_MAX_ROWS": str(args.driver_scan_max_rows)}}
        if args.driver_scan_max_rows is not None
        else None,
    )
    with LocalCluster(args.data / "ray") as cluster:
        os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection_json()
        hook = RayHook()
        spec = operator.build_spec(run_key=f"prepath-{args.rows}")
        runtime_env = operator._runtime_env(hook, spec)
        with DriverRss() as rss:
            job_id = hook.submit_job(operator.entrypoint(spec), runtime_env=runtime_env)
            while not hook.get_job_status(job_id).is_terminal:
                time.sleep(1)
        spilled = spilled_bytes(cluster)
        info = hook.get_job_info(job_id)
        logs = hook.get_job_logs(job_id)
    (args.out.parent / "prepath_job.log").write_text(logs[-200_000:])
    if info.status.value != "SUCCEEDED":
        raise SystemExit(f"job {job_id} {info.status.value}: {info.message}\n{logs[-3000:]}")
    manifest = manifest_from_log(logs)
    wall = (info.end_time_ms - info.start_time_ms) / 1000
    counts_add_up = manifest["rows_in"] == manifest["rows_out"] + manifest["rows_failed"] == args.rows
    result: dict[str, Any] = {  # Any: JSON values
        "what": "dry run (pre-engine path) on generated customer rows",
        "command": " ".join(["bench/prepath.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {_memory_gib():.0f} GiB",
        "rows": args.rows,
        "files": -(-args.rows // args.rows_per_file),
        "wall_s": round(wall, 1),
        "rows_per_s": round(args.rows / wall),
        "driver_peak_rss_mib": round(rss.peak_bytes / 2**20),
        "object_store_spilled_mib": None if spilled is None else round(spilled / 2**20),
        "duplicates_generated": duplicates,
        "duplicates_found": manifest["rows_duplicate"],
        "bad_rows_generated": bad,
        "counts_add_up": counts_add_up,
        "manifest": manifest,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print()
    print(
        "| rows | files | wall s | rows/s | driver peak RSS MiB | spilled MiB | duplicates (gen / found) "
        "| counts add up |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    print(
        f"| {args.rows:,} | {result['files']} | {result['wall_s']} | {result['rows_per_s']:,} | "
        f"{result['driver_peak_rss_mib']:,} | {result['object_store_spilled_mib']} | "
        f"{duplicates:,} / {manifest['rows_duplicate']:,} | {counts_add_up} |"
    )
    print(f"\nwrote {args.out}")
    if not counts_add_up or manifest["rows_duplicate"] != duplicates:
        raise SystemExit("the dry run's counts do not match what was generated")


def _memory_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


if __name__ == "__main__":
    main()
