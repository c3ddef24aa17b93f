"""Issue 20's backfill table, from one device run: 7 cold raw vLLM scripts back to back against our 7
dates on one warm engine pool (``keep_warm_seconds``), 2,000 rows a date, the 8B shape.

Reads KEEP/a-2000@d1.json ... a-2000@d7.json (run_gpu.sh's ``a:2000@dK``: bench/raw_vllm.py, each a
fresh process that builds its own engine) and KEEP/b-backfill-d1.json ... d7 (``b:backfill-dK``: each
date a Ray job through the Jobs API, as the operator submits it). Prints a table, writes JSON.

* raw: launch to outputs written, per script (``end_to_end_s``), summed;
* ours: submit to ``manifest.json`` written, per job (``end_to_end_s``), summed; the dates run one after
  another, as a backfill with ``max_active_runs=1`` does;
* a warm date's "submit to first row": submit to its first staged part (``first_part_after_submit_s``,
  an upper bound: a part holds half a batch of finished rows) and the manifest's engine start to first
  row.

usage: python3 bench/gpu/backfill_summary.py KEEP OUT_JSON
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

DATES = range(1, 8)


def _load(path: Path) -> dict[str, Any] | None:  # Any: JSON values.
    return json.loads(path.read_text()) if path.exists() else None


def summarize(keep: Path) -> dict[str, Any]:  # Any: JSON values.
    raw = [_load(keep / f"a-2000@d{day}.json") for day in DATES]
    ours = [_load(keep / f"b-backfill-d{day}.json") for day in DATES]
    rows = []
    for day, raw_run, our_run in zip(DATES, raw, ours, strict=True):
        manifest = (our_run or {}).get("manifest") or {}
        pool = manifest.get("engine_pool") or {}
        timings = manifest.get("timings") or {}
        rows.append(
            {
                "date": day,
                "raw_end_to_end_s": raw_run and round(raw_run["end_to_end_s"], 1),
                "raw_startup_s": raw_run and round(raw_run["startup_s"], 1),
                "ours_end_to_end_s": our_run and round(our_run["end_to_end_s"], 1),
                "ours_submit_to_first_part_s": our_run
                and our_run.get("first_part_after_submit_s")
                and round(our_run["first_part_after_submit_s"], 1),
                "ours_engine_start_to_first_row_s": timings.get("engine_start_to_first_row_s"),
                "ours_generating_s": timings.get("generating_s"),
                "warm_replicas": pool.get("warm_replicas"),
                "rows_out": manifest.get("rows_out"),
            }
        )
    complete = all(raw) and all(ours)
    raw_total = sum(r["raw_end_to_end_s"] for r in rows) if complete else None
    ours_total = sum(r["ours_end_to_end_s"] for r in rows) if complete else None
    warm = [
        r["ours_submit_to_first_part_s"] for r in rows[1:] if r["ours_submit_to_first_part_s"] is not None
    ]
    return {
        "dates": rows,
        "raw_total_s": raw_total,
        "ours_total_s": ours_total,
        "ratio_raw_over_ours": round(raw_total / ours_total, 2) if complete and ours_total else None,
        "warm_submit_to_first_part_median_s": round(statistics.median(warm), 1) if warm else None,
    }


def main() -> None:
    keep, out = Path(sys.argv[1]), Path(sys.argv[2])
    summary = summarize(keep)
    out.write_text(json.dumps(summary, indent=1))
    header = (
        "date",
        "raw e2e s",
        "raw start-up s",
        "ours e2e s",
        "ours submit->1st part s",
        "engine start->1st row s",
        "generating s",
        "warm",
        "rows out",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in summary["dates"]:
        print("| " + " | ".join(str(value) for value in row.values()) + " |")
    print(
        f"BACKFILL raw {summary['raw_total_s']} s, ours {summary['ours_total_s']} s, raw/ours "
        f"{summary['ratio_raw_over_ours']}; warm submit to first part, median "
        f"{summary['warm_submit_to_first_part_median_s']} s"
    )


if __name__ == "__main__":
    main()
