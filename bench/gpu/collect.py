"""Tables of the GPU compare from the files the device runs sent back (bench/results/gpu/).

Re-derives (b)'s engine phases from each job's own actor-creation tasks: the Ray head stayed up
between jobs, so the state API also listed earlier jobs' actors (phases.py now keeps only those
created after the submit; the first run of ours_job.py picked the earliest). The submit time is
recovered from the driver's "Connected to Ray cluster" log line and its recorded offset.

usage: python3 bench/gpu/collect.py [bench/results/gpu]     -> prints the tables, writes gpu_compare.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import phases  # noqa: E402


def fixed(ours: dict, logs: str) -> dict:
    t_submit = ours.get("t_submit_epoch")
    if t_submit is None:
        t_submit = (
            phases.ray_log_times(logs, r"Connected to Ray cluster")[0]
            - ours["driver_connected_after_submit_s"]
        )
    tasks = [t for t in ours["actor_creation_tasks"] if (t.get("created") or 0) >= t_submit]
    engine = next(t for t in tasks if "vLLMEngineStage" in t["name"])
    ready = engine["FINISHED"] - t_submit
    out = {k: v for k, v in ours.items() if k != "actor_creation_tasks"}
    out.update(
        t_submit_epoch=t_submit,
        engine_actor_requested_after_submit_s=engine["created"] - t_submit,
        engine_init_start_after_submit_s=engine["RUNNING"] - t_submit,
        engine_ready_after_submit_s=ready,
        engine_start_s=engine["FINISHED"] - engine["RUNNING"],
        startup_s=ready,
        generating_s=ours["last_part_after_submit_s"] - ready,
        other_actor_inits_s={
            t["name"].split(".")[0][:60]: round(t["FINISHED"] - t["RUNNING"], 1)
            for t in tasks
            if t is not engine and t.get("FINISHED") and t.get("RUNNING")
        },
    )
    return phases.add_rates(out)


#: (title, raw result file, ours result file), relative to the results folder. Lease 1: one machine, caches
#: cleared before every run ("cold": the 'cold' stage of run_gpu.sh). Lease 2: a fresh machine, no
#: clearing; each engine's second run loads its torch.compile cache (raw and Ray Data LLM hash to different
#: cache entries, so each needs its own first run).
PAIRS = (
    ("2000 x 128/128, cold (lease 1; compile caches cleared before each run)", "a-2000-cold", "b-ours-2000"),
    ("20,000 x 128/128, cold (lease 1)", "a-20000", "b-ours-20000"),
    (
        "2000 x 128/128, first run of each engine on a fresh machine (lease 2)",
        "lease2/a-2000-first",
        "lease2/b-ours-2000",
    ),
    (
        "2000 x 128/128, second run of each: warm torch.compile cache (lease 2)",
        "lease2/a-2000-second",
        "lease2/b-ours-2000-warm",
    ),
)
EXTRA = (
    ("  submit -> job start (s)", "job_start_after_submit_s", "{:.1f}"),
    ("  submit -> driver connected (s)", "driver_connected_after_submit_s", "{:.1f}"),
    ("  submit -> ray.data.llm dataset starts (s)", "llm_dataset_start_after_submit_s", "{:.1f}"),
    ("  submit -> vLLM actor __init__ starts (s)", "engine_init_start_after_submit_s", "{:.1f}"),
    ("  last part -> manifest (s)", "commit_s", "{:.1f}"),
    ("  manifest -> job end (s)", "manifest_to_job_end_s", "{:.1f}"),
)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "results" / "gpu"
    report: dict = {"tables": {}, "ratios_b_over_a": {}, "runs": {}}
    for title, raw_name, ours_name in PAIRS:
        raw = json.loads((folder / f"{raw_name}.json").read_text())
        ours = fixed(
            json.loads((folder / f"{ours_name}.json").read_text()), (folder / f"{ours_name}.log").read_text()
        )
        report["runs"][title] = {"a": raw, "b": ours}
        report["tables"][title] = phases.table(raw, ours, EXTRA)
        report["ratios_b_over_a"][title] = phases.ratios(raw, ours)
        print(f"\n{title}\n{report['tables'][title]}")
    (folder / "gpu_compare.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
