"""Commit on an S3-compatible server on loopback: how long making N rows' staged parts a version takes.

A run stages its rows as parts, each a data file plus a sidecar, a few tens of rows each (an engine
replica stages every half batch: 2,000,000 rows at ``batch_size=64`` are 62,500 parts). This bench
stages ``--rows`` rows that way (untimed, in parallel) on a moto server in its own process, then
times ``commit.write_version`` + ``commit.publish``, the driver's whole commit:

- ``in place, reported`` (this pipeline): the data files were staged into the version folder and the
  replicas reported each part's sidecar with their batches; commit lists the folders, reads back no
  sidecar and moves nothing;
- ``in place, read back`` (``--read-back``, as for parts whose replica died before reporting them):
  commit reads every sidecar (32 at once);
- ``moved`` (``--legacy``, a staging from before in-place commits): commit copies and deletes each
  data file into the version folder, as every commit did before.

usage: .venvs/airflow/bin/python bench/commit_s3.py --rows 2000000 [--read-back | --legacy]
                                                   [--out bench/results/commit_s3.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUCKET = "raybatch-bench"
KEY, SECRET = "AKIARAYBATCHBENCH001", "bench-secret-not-a-real-one"


def log(message: str) -> None:
    print(f"[commit_s3 {datetime.now():%H:%M:%S}] {message}", flush=True)


def start_moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [str(ROOT / ".venvs" / "airflow" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"moto_server did not listen on {port}")


def result_rows(first: int, count: int) -> list[dict[str, Any]]:  # Any: row values
    """Rows as a replica stages them: an output record each, like the example DAG's."""
    rows = []
    for i in range(first, first + count):
        record = {
            "Customer Id": f"C{i:012d}",
            "Company": "Blue River Labs",
            "Country": "Portugal",
            "generated_text": "Technology",
            "num_input_tokens": 64,
            "num_generated_tokens": 2,
        }
        rows.append(
            {
                "source": f"customers.csv:{i + 2}",
                "ok": True,
                "record": json.dumps(record),
                "label": "Technology",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rows-per-part", type=int, default=32, help="half of batch_size=64")
    parser.add_argument("--legacy", action="store_true", help="a staging from before in-place commits")
    parser.add_argument("--read-back", action="store_true", help="commit reads every sidecar back")
    parser.add_argument("--port", type=int, default=8297)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "commit_s3.json")
    args = parser.parse_args()

    import boto3

    from airflow_provider_raybatch.pipeline import storage
    from airflow_provider_raybatch.pipeline.stage import commit
    from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    server = start_moto(args.port)
    try:
        endpoint = f"http://127.0.0.1:{args.port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        storage._s3_options = storage.S3Options(
            endpoint_url=endpoint, region="us-east-1", access_key=KEY, secret_key=SECRET
        )
        spec = BatchInferenceSpec.build(
            model="m",
            input_uri=f"s3://{BUCKET}/in/customers.csv",
            output_uri=f"s3://{BUCKET}/out",
            user_template="{Company}",
            run_key="bench",
            output_format="parquet",
        )
        layout = storage.OutputLayout(spec.output_uri, spec.run_key)
        if args.legacy:
            storage.write_text(layout.staged_spec_uri, json.dumps({"fingerprint": spec.fingerprint()}))
        else:
            commit.open_staging(layout, spec)
        writer = PartWriter(
            layout.staging_uri, "parquet", count_labels=True, data_uri=commit.staged_data_uri(layout)
        )
        writer.create_folders()
        starts = range(0, args.rows, args.rows_per_part)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:

            def stage(start: int) -> Any:  # Any: a StagedPart
                return writer.write_part(result_rows(start, min(args.rows_per_part, args.rows - start)))

            staged = list(pool.map(stage, starts))
        reported = [] if args.read_back or args.legacy else staged
        log(
            f"staged {len(starts):,} parts ({args.rows:,} rows) in {time.perf_counter() - t0:.0f} s (untimed)"
        )

        t0 = time.perf_counter()
        run = commit.write_version(layout, spec, args.rows, rewriter=writer, known_parts=reported)
        t_version = time.perf_counter() - t0
        commit.publish(layout, {"version": run.version, "status": "complete"}, keep_versions=False)
        t_commit = time.perf_counter() - t0
        outputs = storage.list_files(run.outputs_uri)
    finally:
        server.kill()
    result = {
        "what": "commit (write_version + publish) on moto_server over loopback",
        "command": " ".join(["bench/commit_s3.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs",
        "mode": "moved (legacy staging)"
        if args.legacy
        else ("in place, read back" if args.read_back else "in place, reported"),
        "rows": args.rows,
        "parts": len(starts),
        "objects_staged": 3 * len(starts),
        "write_version_s": round(t_version, 1),
        "commit_s": round(t_commit, 1),
        "rows_committed": run.rows_out,
        "output_files": len(outputs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print("\n| mode | rows | parts | objects staged | write_version s | commit s | rows committed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {result['mode']} | {args.rows:,} | {len(starts):,} | {3 * len(starts):,} | "
        f"{result['write_version_s']} | {result['commit_s']} | {run.rows_out:,} |"
    )
    print(f"\nwrote {args.out}")
    if run.rows_out != args.rows or len(outputs) != len(starts):
        raise SystemExit("the commit lost or doubled rows")


if __name__ == "__main__":
    main()
