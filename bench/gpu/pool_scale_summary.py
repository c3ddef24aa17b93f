"""Issue 23's table, from one device run: 20,000 requests on a warm engine pool of one replica against a
pool of two (two GPUs), each cold (the job that builds the pool) and warm (the next job on it).

Reads KEEP/b-pool1-cold.json, b-pool1-warm.json, b-pool2-cold.json, b-pool2-warm.json (run_gpu.sh's
``b:NAME``: each a Ray job through the Jobs API, as the operator submits it). Prints a table, writes JSON.

* end to end: submit to ``manifest.json`` written (``end_to_end_s``);
* generating: the manifest's first to last finished row (``timings.generating_s``);
* replica start skew: how far apart the replicas built for the job became ready (the manifest's
  ``engine_pool.replica_ready_skew_s``, from each replica's own clock on one host).

usage: python3 bench/gpu/pool_scale_summary.py KEEP OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RUNS = ("pool1-cold", "pool2-cold", "pool1-warm", "pool2-warm")


def _row(result: dict[str, Any], committed: Path) -> dict[str, Any]:  # Any: JSON values.
    # The committed manifest (run_gpu.sh copies it as KEEP/manifest-NAME.json): the job log's may be cut.
    manifest = json.loads(committed.read_text()) if committed.exists() else result.get("manifest") or {}
    pool = manifest.get("engine_pool") or {}
    timings = manifest.get("timings") or {}
    return {
        "end_to_end_s": round(result["end_to_end_s"], 1),
        "submit_to_first_part_s": result.get("first_part_after_submit_s")
        and round(result["first_part_after_submit_s"], 1),
        "engine_start_to_first_row_s": timings.get("engine_start_to_first_row_s"),
        "generating_s": timings.get("generating_s"),
        "commit_s": timings.get("commit_s"),
        "warm_replicas": f"{pool.get('warm_replicas')}/{pool.get('replicas')}",
        "replica_ready_skew_s": pool.get("replica_ready_skew_s"),
        "replica_timings": pool.get("replica_timings"),
        "rows_out": manifest.get("rows_out"),
        "gpu_seconds_held": timings.get("gpu_seconds_held"),
    }


def _ratio(one: dict[str, Any] | None, two: dict[str, Any] | None, key: str) -> float | None:
    if not one or not two or not one.get(key) or not two.get(key):
        return None
    return round(one[key] / two[key], 2)


def summarize(keep: Path) -> dict[str, Any]:  # Any: JSON values.
    rows = {
        name: _row(json.loads((keep / f"b-{name}.json").read_text()), keep / f"manifest-{name}.json")
        for name in RUNS
        if (keep / f"b-{name}.json").exists()
    }
    speedups = {
        state: {
            "end_to_end": _ratio(rows.get(f"pool1-{state}"), rows.get(f"pool2-{state}"), "end_to_end_s"),
            "generating": _ratio(rows.get(f"pool1-{state}"), rows.get(f"pool2-{state}"), "generating_s"),
        }
        for state in ("cold", "warm")
    }
    return {"runs": rows, "two_over_one": speedups}


def main() -> None:
    keep, out = Path(sys.argv[1]), Path(sys.argv[2])
    summary = summarize(keep)
    out.write_text(json.dumps(summary, indent=1))
    header = (
        "run",
        "e2e s",
        "submit->1st part s",
        "engine start->1st row s",
        "generating s",
        "commit s",
        "warm",
        "replica ready skew s",
        "rows out",
        "GPU-s held",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, row in summary["runs"].items():
        cells = [name] + [str(value) for key, value in row.items() if key != "replica_timings"]
        print("| " + " | ".join(cells) + " |")
    for state, ratio in summary["two_over_one"].items():
        print(
            f"POOL2X {state}: two replicas / one, end to end {ratio['end_to_end']}x, generating "
            f"{ratio['generating']}x"
        )


if __name__ == "__main__":
    main()
