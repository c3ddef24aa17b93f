"""Tables of the start-up work (issue 9, GPU points 3 and 4) from bench/results/gpu/startup/.

Leases: A = H100 (code at commit "forkserver started in the replica's __init__"), B = 2 x H200 (same code),
C = H100, a fresh machine (the forkserver started when the replica unpickles its UDF class).
D, E, F = H100s, fresh machines (branch perf: the driver builds the processor without vLLM, torch or
transformers); E and F alternate that branch ("perf") with main ("base") on one machine; E's Ray head was
started inside the base checkout, F's from / (see RESULTS.md, section 6).
Each (b) JSON is ours_job.py's result; the two-replica run's engines come from its actor-creation tasks.

usage: python3 bench/gpu/collect_startup.py     -> prints the tables, writes startup/summary.json
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import phases  # noqa: E402

HERE = ROOT / "bench" / "results" / "gpu" / "startup"
PAIRS = (
    ("A: 2000, cold, H100", "A-a-2000-cold", "A-b-ours-2000-cold"),
    ("A: 2000, ours warm (2nd run) vs raw cold, H100", "A-a-2000-cold", "A-b-ours-2000-warm-fs"),
    ("A: 2000, ours warm, RAYBATCH_ENGINE_FORKSERVER=0", "A-a-2000-cold", "A-b-ours-2000-warm-nofs"),
    ("A: 20,000, cold, H100", "A-a-20000-cold", "A-b-ours-20000-cold"),
    ("C: 2000, ours cold (first job on a fresh H100) vs raw", "C-a-2000-after-ours", "C-b-ours-2000-cold"),
    ("C: 2000, ours 2nd run vs raw", "C-a-2000-after-ours", "C-b-ours-2000-warm2"),
    ("C: 2000, ours 3rd run vs raw", "C-a-2000-after-ours", "C-b-ours-2000-warm3"),
    ("D: 2000, ours cold (first job of a fresh H100) vs raw", "D-a-2000-after-ours", "D-b-ours-2000-cold"),
    ("D: 2000, ours 2nd run (perf) vs raw", "D-a-2000-after-ours", "D-b-ours-2000-warm"),
)
#: Jobs whose driver phases are compared (driver log timestamps), each lease's in the order they ran.
DRIVER_RUNS = (
    "A-b-ours-2000-cold",
    "A-b-ours-2000-warm-fs",
    "C-b-ours-2000-cold",
    "C-b-ours-2000-warm2",
    "C-b-ours-2000-warm3",
    "D-b-ours-2000-cold",
    "D-b-ours-2000-warm",
    *(f"E-b-ours-2000-{n}" for n in ("base1", "perf1", "perf2", "base2", "perf3", "base3")),
    *(f"F-b-ours-2000-{n}" for n in ("perf1", "base1", "perf2", "base2")),
)


def load(name: str) -> dict | None:
    path = HERE / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def engines(ours: dict) -> list[dict[str, float]]:
    """Each vLLM replica of the job: its __init__ start and end, seconds after submit."""
    t0 = ours["t_submit_epoch"]
    return [
        {"init_start_s": round(t["RUNNING"] - t0, 1), "ready_s": round(t["FINISHED"] - t0, 1)}
        for t in ours.get("actor_creation_tasks", [])
        if "vLLMEngineStage" in t["name"] and (t.get("created") or 0) >= t0
    ]


def driver_phases(name: str) -> dict[str, float]:
    """Seconds between the driver's own log lines: connected, the dataset executions, the build's ray.init.

    ``import_window_s``: last execution before the processor -> the build's ``ray.init()`` ("Calling
    ray.init() again"): importing ray.data.llm (Ray 2.57: vLLM, torch, transformers) and the config.
    """
    stamped = []
    for line in (HERE / f"{name}.log").read_text(errors="replace").splitlines():
        if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line):
            stamped.append((datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"), line))
    connected = next(t for t, line in stamped if "Connected to Ray" in line)
    starts = [t for t, line in stamped if "Starting execution of Dataset" in line]
    again = next(t for t, line in stamped if "ray.init() again" in line)
    last_before = max(t for t, line in stamped if "execution finished" in line and t < again)

    def seconds(a: datetime.datetime, b: datetime.datetime) -> float:
        return round((b - a).total_seconds(), 2)

    ours = load(name) or {}
    created = [k for k in ours.get("other_actor_inits_s", {}) if "MapWorker" not in k]
    return {
        "connected_to_first_execution_s": seconds(connected, starts[0]),
        "import_window_s": seconds(last_before, again),
        "build_to_llm_dataset_s": seconds(again, starts[-1]),
        "connected_to_llm_dataset_s": seconds(connected, starts[-1]),
        "submit_to_engine_init_s": round(ours.get("engine_init_start_after_submit_s", 0), 1),
        "end_to_end_s": round(ours.get("end_to_end_s", 0), 1),
        "helper_actors_created": len(created),  # Ray Data's stats/autoscaler actors and the telemetry agent
    }


def main() -> None:
    summary: dict = {"pairs": {}, "scale": {}, "driver": {}}
    for title, a_name, b_name in PAIRS:
        a, b = load(a_name), load(b_name)
        if not (a and b):
            continue
        print(f"\n{title}  ({a_name} / {b_name})\n" + phases.table(a, b))
        summary["pairs"][title] = {
            "raw": a_name,
            "ours": b_name,
            "raw_over_ours_end_to_end": a["end_to_end_s"] / b["end_to_end_s"],
            "raw_over_ours_generating": a["generating_s"] / b["generating_s"],
            "ours_end_to_end_s": b["end_to_end_s"],
            "raw_end_to_end_s": a["end_to_end_s"],
        }
    one, two = load("B-b-ours-20000-cold"), load("B-b-scale-2-cold")
    if one and two:
        replicas = engines(two)
        summary["scale"] = {
            "one_replica_end_to_end_s": one["end_to_end_s"],
            "two_replicas_end_to_end_s": two["end_to_end_s"],
            "speedup_end_to_end": one["end_to_end_s"] / two["end_to_end_s"],
            "one_replica_generating_s": one["generating_s"],
            "two_replicas_generating_s": two["generating_s"],
            "speedup_generating": one["generating_s"] / two["generating_s"],
            "two_replicas_engines": replicas,
            "engines_ready_spread_s": max(r["ready_s"] for r in replicas)
            - min(r["ready_s"] for r in replicas),
        }
        print("\nB: 20,000 on 2 x H200, one replica vs two\n" + json.dumps(summary["scale"], indent=1))
    print("\nDriver phases, seconds (driver log timestamps):")
    for name in DRIVER_RUNS:
        if (HERE / f"{name}.log").exists():
            summary["driver"][name] = driver_phases(name)
            print(name, json.dumps(summary["driver"][name]))
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
