"""Issue 48's replicas-per-GPU table: raw vLLM and ours at 1..4 replicas on one GPU, with vLLM's own stats
and the GPU's utilization while generating.

Reads, from a folder (the device's /tmp/keep, or results.tgz unpacked here), per cell NAME:
  a-NAME.json, a-NAME-raw.json      raw vLLM (run_gpu.sh's a: stage; -raw: bench/raw_vllm.py's own epochs)
  b-NAME.json, manifest-NAME.json   ours (ours_job.py's result; the committed manifest)
  gpu-a-NAME.json / gpu-b-NAME.json bench/gpu/gpumon.py's samples (GPU utilization, cores per group)
  logs/a-NAME.log                   raw's log: vLLM's stats lines
  logs/vllmstats-b-NAME.txt         the replicas' stats lines (grep -H of the Ray session's worker logs)

The generating window: raw's ``LLM.generate`` calls (first call's start -> last one's end); ours' first
engine part staged -> last part staged (the issue's "generating"). vLLM's stats lines (``Engine 000: Avg
prompt throughput ... Running: N reqs, Waiting: M reqs, GPU KV cache usage: K%, Prefix cache hit rate:
P%``, one every VLLM_LOG_STATS_INTERVAL s per engine, at debug level when the engine is idle) and the
GPU samples are kept when they fall inside it; "running" / "waiting" are each engine's mean, and the sum
over the engines; throughputs are summed over the engines.

usage: python3 bench/gpu/rpg_summary.py [FOLDER] [FAMILY ...]   (default /tmp/keep; families: rpg-100k,
       rpg-200k, rt-2000, those whose files are there) -> Markdown on stdout, FOLDER/rpg.json
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

STATS = re.compile(r"(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? \[[^\]]*\] Engine \d+: (?P<rest>.*)")
FIELDS = {
    "prompt_tps": r"Avg prompt throughput: ([\d.]+) tokens/s",
    "gen_tps": r"Avg generation throughput: ([\d.]+) tokens/s",
    "running": r"Running: (\d+) reqs",
    "waiting": r"Waiting: (\d+) reqs",
    "kv_pct": r"KV cache usage: ([\d.]+)%",
    "prefix_hit_pct": r"(?<!External )Prefix cache hit rate: ([\d.]+)%",
    "preemptions": r"Preemptions: (\d+)",
}
PIDFILE = re.compile(r"worker-[0-9a-f]+-[0-9a-f]+-(\d+)\.(?:out|err)")
PIDPREFIX = re.compile(r"pid=(\d+)")


def _load(path: Path) -> Any:  # Any: JSON.
    return json.loads(path.read_text()) if path.exists() else None


def _epoch(month_day: str, hms: str, year: int) -> float:
    """vLLM's log time (local time, no year) as epoch seconds."""
    return time.mktime(datetime.strptime(f"{year}-{month_day} {hms}", "%Y-%m-%d %H:%M:%S").timetuple())


def stats_lines(text: str, year: int, default_engine: str = "raw") -> list[dict[str, Any]]:  # Any: JSON.
    out = []
    for line in text.splitlines():
        match = STATS.search(line)
        if not match or "Avg prompt throughput" not in line:
            continue
        engine = default_engine
        head = line[: match.start()]
        found = PIDFILE.search(head) or PIDPREFIX.search(head)
        if found:
            engine = found.group(1)
        row: dict[str, Any] = {"t": _epoch(match["md"], match["hms"], year), "engine": engine}  # Any: JSON.
        for key, pattern in FIELDS.items():
            value = re.search(pattern, match["rest"])
            row[key] = float(value.group(1)) if value else None
        out.append(row)
    return out


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def stats_summary(lines: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:  # Any: JSON.
    # The log's time has 1 s resolution: a line stamped in the window's last second still counts.
    kept = [line for line in lines if start - 1 <= line["t"] <= end + 1]
    engines = sorted({line["engine"] for line in kept})
    per_engine = {e: [line for line in kept if line["engine"] == e] for e in engines}
    running = {e: _mean([line["running"] for line in rows]) for e, rows in per_engine.items()}
    waiting = {e: _mean([line["waiting"] for line in rows]) for e, rows in per_engine.items()}
    prompt = {e: _mean([line["prompt_tps"] for line in rows]) for e, rows in per_engine.items()}
    gen = {e: _mean([line["gen_tps"] for line in rows]) for e, rows in per_engine.items()}
    return {
        "lines": len(kept),
        "engines": len(engines),
        "running_mean_per_engine": _mean(list(running.values())),
        "running_mean_sum": sum(v for v in running.values() if v is not None) if running else None,
        "running_max": max((line["running"] or 0 for line in kept), default=None),
        "waiting_mean_per_engine": _mean(list(waiting.values())),
        "waiting_mean_sum": sum(v for v in waiting.values() if v is not None) if waiting else None,
        "prompt_tps_sum": sum(v for v in prompt.values() if v is not None) if prompt else None,
        "gen_tps_sum": sum(v for v in gen.values() if v is not None) if gen else None,
        "prefix_hit_pct_mean": _mean([line["prefix_hit_pct"] for line in kept]),
        "kv_pct_mean": _mean([line["kv_pct"] for line in kept]),
        "kv_pct_max": max((line["kv_pct"] or 0 for line in kept), default=None),
        "preemptions_max": max((line["preemptions"] or 0 for line in kept), default=None),
    }


def gpu_summary(mon: dict[str, Any] | None, start: float, end: float) -> dict[str, Any]:  # Any: JSON.
    samples = [s for s in (mon or {}).get("samples", []) if start <= s["t"] <= end]
    if not samples:
        return {"samples": 0}
    groups = sorted({g for s in samples for g in s.get("group_cores", {})})
    return {
        "samples": len(samples),
        "gpu_util_mean": _mean([s.get("gpu_util") for s in samples]),
        "gpu_util_p50": statistics.median(
            [s["gpu_util"] for s in samples if s.get("gpu_util") is not None] or [0]
        ),
        "mem_util_mean": _mean([s.get("mem_util") for s in samples]),
        "mem_used_mib_max": max((s.get("mem_used_mib") or 0 for s in samples), default=None),
        "power_w_mean": _mean([s.get("power_w") for s in samples]),
        "sm_mhz_mean": _mean([s.get("sm_mhz") for s in samples]),
        "host_busy_cores_mean": _mean([s.get("host_busy_cores") for s in samples]),
        "group_cores_mean": {
            g: _mean([s.get("group_cores", {}).get(g, 0.0) for s in samples]) for g in groups
        },
    }


def raw_cell(folder: Path, name: str) -> dict[str, Any] | None:  # Any: JSON.
    result, epochs = _load(folder / f"a-{name}.json"), _load(folder / f"a-{name}-raw.json")
    if not result:
        return None
    cell: dict[str, Any] = {  # Any: JSON.
        "cell": f"raw vLLM ({name})",
        "replicas": "raw",
        "end_to_end_s": result.get("end_to_end_s"),
        "generating_s": result.get("generating_s"),
        "rows": result.get("rows"),
        "rows_per_s_generating": (result["rows"] / result["generating_s"])
        if result.get("generating_s")
        else None,
        "engine_start_s": result.get("engine_start_s"),
        "tokens_out": result.get("tokens_out"),
    }
    if epochs:
        start, end = epochs["t_generate_start"], epochs["t_generate_end"]
        year = datetime.fromtimestamp(start).year
        log = folder / "logs" / f"a-{name}.log"
        lines = stats_lines(log.read_text(errors="replace"), year) if log.exists() else []
        cell["vllm"] = stats_summary(lines, start, end)
        cell["gpu"] = gpu_summary(_load(folder / f"gpu-a-{name}.json"), start, end)
        cell["window"] = [start, end]
    return cell


def ours_cell(folder: Path, name: str) -> dict[str, Any] | None:  # Any: JSON.
    result = _load(folder / f"b-{name}.json")
    if not result:
        return None
    phase = result.get("phases") or {}
    manifest = _load(folder / f"manifest-{name}.json") or {}
    timings = manifest.get("timings") or {}
    job = _load(Path(__file__).resolve().parent / "jobs" / f"{name}.json") or {}
    layout = manifest.get("layout") or {}  # the engine layout made (generate/default_layout.py)
    label = f"{job.get('replicas_per_gpu', '?')} per GPU"
    if job.get("replicas_per_gpu") == "default":
        label = f"default layout: {layout.get('replicas_per_gpu', '?')} per GPU"
    cell: dict[str, Any] = {  # Any: JSON.
        "cell": f"ours, {label} ({name})",
        "replicas": job.get("replicas_per_gpu"),
        "layout": layout or None,
        "end_to_end_s": result.get("end_to_end_s"),
        "generating_s": phase.get("first_to_last_part_s"),
        "manifest_generating_s": timings.get("generating_s"),
        "rows": phase.get("engine_part_rows"),
        "rows_out": manifest.get("rows_out"),
        "rows_per_s_generating": result.get("rows_per_s_generating"),
        "engine_build_s": timings.get("engine_build_s"),
        "engine_start_to_first_row_s": timings.get("engine_start_to_first_row_s"),
        "read_and_prepare_s": timings.get("read_and_prepare_s"),
        "tokens_out": result.get("tokens_out"),
    }
    if phase.get("first_to_last_part_s") is None:  # random-token jobs: no phases from the driver log
        cell["generating_s"] = result.get("generating_s")
    t0 = result.get("t_submit_epoch")
    if t0 is not None and phase.get("submit_to_first_engine_part_s") is not None:
        start, end = t0 + phase["submit_to_first_engine_part_s"], t0 + phase["submit_to_last_part_s"]
    elif t0 is not None and result.get("engine_ready_after_submit_s") is not None:
        start, end = t0 + result["engine_ready_after_submit_s"], t0 + result["last_part_after_submit_s"]
    else:
        return cell
    if not result.get("rows_per_s_generating") and cell["generating_s"]:
        cell["rows_per_s_generating"] = (result.get("rows") or 0) / cell["generating_s"]
    year = datetime.fromtimestamp(start).year
    log = folder / "logs" / f"vllmstats-b-{name}.txt"
    lines = stats_lines(log.read_text(errors="replace"), year, default_engine="?") if log.exists() else []
    if not lines and (folder / f"b-{name}.log").exists():  # the job's log (Ray may dedupe equal lines there)
        lines = stats_lines((folder / f"b-{name}.log").read_text(errors="replace"), year, default_engine="?")
    cell["vllm"] = stats_summary(lines, start, end)
    cell["gpu"] = gpu_summary(_load(folder / f"gpu-b-{name}.json"), start, end)
    cell["window"] = [start, end]
    return cell


def _f(value: Any, digits: int = 1) -> str:  # Any: a JSON value.
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(cells: list[dict[str, Any]]) -> str:  # Any: JSON.
    raw = next((c for c in cells if c["replicas"] == "raw"), None)
    head = (
        "| cell | end to end s | generating s | rows/s generating | raw/ours end to end | ours/raw rows/s "
        "generating | running per engine (sum) | waiting per engine (sum) | prompt / gen tok/s | "
        "prefix hit % | KV use % mean / max | GPU util % mean (p50) | host cores busy | EngineCore cores |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        v, g = c.get("vllm") or {}, c.get("gpu") or {}
        e2e = raw["end_to_end_s"] / c["end_to_end_s"] if raw and c.get("end_to_end_s") else None
        gen = (
            c["rows_per_s_generating"] / raw["rows_per_s_generating"]
            if raw and c.get("rows_per_s_generating") and raw.get("rows_per_s_generating")
            else None
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    c["cell"],
                    _f(c.get("end_to_end_s")),
                    _f(c.get("generating_s")),
                    _f(c.get("rows_per_s_generating"), 0),
                    _f(e2e, 2),
                    _f(gen, 2),
                    f"{_f(v.get('running_mean_per_engine'), 0)} ({_f(v.get('running_mean_sum'), 0)})",
                    f"{_f(v.get('waiting_mean_per_engine'), 0)} ({_f(v.get('waiting_mean_sum'), 0)})",
                    f"{_f(v.get('prompt_tps_sum'), 0)} / {_f(v.get('gen_tps_sum'), 0)}",
                    _f(v.get("prefix_hit_pct_mean")),
                    f"{_f(v.get('kv_pct_mean'))} / {_f(v.get('kv_pct_max'))}",
                    f"{_f(g.get('gpu_util_mean'), 0)} ({_f(g.get('gpu_util_p50'), 0)})",
                    _f(g.get("host_busy_cores_mean")),
                    _f((g.get("group_cores_mean") or {}).get("engine_core")),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/keep")
    families = sys.argv[2:] or ["rpg-100k", "rpg-200k", "rt-2000"]
    report = {}
    for family in families:
        cells = [raw_cell(folder, f"{family}-x1")] + [
            ours_cell(folder, f"{family}-{n}") for n in ("x1", "x2", "x3", "x4", "default")
        ]
        cells = [c for c in cells if c]
        if not cells:
            continue
        report[family] = cells
        print(f"\n### {family}\n\n{table(cells)}\n")
        for c in cells:
            extra = {
                k: c.get(k)
                for k in (
                    "engine_build_s",
                    "engine_start_s",
                    "engine_start_to_first_row_s",
                    "read_and_prepare_s",
                    "manifest_generating_s",
                    "rows",
                    "rows_out",
                    "layout",
                )
            }
            print(
                f"- {c['cell']}: {json.dumps({k: v for k, v in extra.items() if v is not None})}; "
                f"vLLM {json.dumps(c.get('vllm'))}; GPU {json.dumps(c.get('gpu'))}"
            )
    (folder / "rpg.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
