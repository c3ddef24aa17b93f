"""Timing analysis shared by the CPU compare (bench/compare.py) and the GPU one (bench/gpu/ours_job.py).

Standard library and httpx only (both the Airflow env and the GPU image have httpx).

Phases of (b), our pipeline as a Ray job, from what the job already leaves behind (no pipeline change):
  submit -> job start     Ray job info start_time
  driver connected        the driver's "Connected to Ray cluster" log line (ms timestamps)
  LLM dataset start       the driver's last "Starting execution of Dataset" line (the ray.data.llm one)
  engine start            the vLLM stage actor's creation task (Ray state API): RUNNING (``__init__``
                          starts: import vLLM, build the engine) -> FINISHED (engine ready)
  generating              engine ready -> the last staged part sidecar written (file mtime)
  commit                  last part -> manifest.json written; then the driver exits (job end)
(a), raw vLLM, reports the same points from its own timestamps (bench/raw_vllm.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

# Ray's Python log prefix: "2026-11-22 02:40:01,123\tINFO ..." (local time)
_RAY_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\s+(?:INFO|WARNING|DEBUG|ERROR)")


def omp_binding(text: str) -> str:
    """vLLM CPU's thread-binding report, e.g. 'core ids=[0] reserved=[1]'; empty on GPU."""
    cores = re.findall(r"core ids=\[([^\]]*)\]", text)
    reserved = re.findall(r"reserved_cpus=\[([^\]]*)\]", text)
    parts = []
    if cores:
        parts.append(f"core ids=[{cores[-1]}]")
    if reserved:
        parts.append(f"reserved=[{reserved[-1]}]")
    return " ".join(parts)


def add_rates(result: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    result["out_tok_per_s_end_to_end"] = result["tokens_out"] / result["end_to_end_s"]
    if result.get("generating_s"):
        result["out_tok_per_s_generating"] = result["tokens_out"] / result["generating_s"]
    return result


def raw_result(raw: dict[str, Any], t_launch: float, t_exit: float) -> dict[str, Any]:  # Any: JSON values.
    """(a)'s row from bench/raw_vllm.py's timestamps; ``t_launch`` is when its process was started."""
    return add_rates(
        {
            "end_to_end_s": raw["t_outputs_written"] - t_launch,
            "process_exit_s": t_exit - t_launch,
            "startup_s": raw["t_generate_start"] - t_launch,
            "interpreter_and_rows_s": raw["t_import_vllm"] - t_launch,
            # import vLLM + build the engine: what the vLLM stage actor's __init__ does in (b)
            "engine_start_s": raw["t_engine_ready"] - raw["t_import_vllm"],
            "import_vllm_s": raw["t_engine_start"] - raw["t_import_vllm"],
            "generating_s": raw["t_generate_end"] - raw["t_generate_start"],
            "write_s": raw["t_outputs_written"] - raw["t_generate_end"],
            "rows": raw["rows"],
            "tokens_in": raw["tokens_in"],
            "tokens_out": raw["tokens_out"],
        }
    )


def watch_parts(
    is_terminal: Callable[[], bool], staging: Path, poll_seconds: float = 0.5
) -> list[dict[str, Any]]:
    """Poll until ``is_terminal()``, recording each staged part sidecar (pipeline/sink.py) as it appears."""
    parts: dict[str, dict[str, Any]] = {}  # Any: JSON values.
    while True:
        done = is_terminal()
        for path in (staging / "parts").glob("*.json"):
            if path.name in parts:
                continue
            try:
                sidecar = json.loads(path.read_text())
                mtime = path.stat().st_mtime
            except (OSError, json.JSONDecodeError):
                continue  # removed by the commit, or not yet whole
            parts[path.name] = {
                "seen": time.time(),
                "mtime": mtime,
                "tokens_out": sidecar["tokens_out"],
                "rows": sidecar["rows_out"] + sidecar["rows_failed"],
            }
        if done:
            return sorted(parts.values(), key=lambda part: part["mtime"])
        time.sleep(poll_seconds)


def creation_tasks(address: str, headers: dict[str, str]) -> list[dict[str, Any]]:  # Any: JSON values.
    """Every actor-creation task of the cluster with its state-change times (Ray state API).

    An actor's ``__init__`` runs as its creation task: RUNNING is when ``__init__`` starts (its worker
    process is up), FINISHED when it returns; for the vLLM stage that is "engine ready".
    """
    import httpx

    params = {
        "limit": 10000,
        "detail": "true",
        "filter_keys": "type",
        "filter_predicates": "=",
        "filter_values": "ACTOR_CREATION_TASK",
    }
    response = httpx.get(f"{address}/api/v0/tasks", headers=headers, params=params, timeout=60)
    response.raise_for_status()
    out = []
    for task in response.json()["data"]["result"]["result"]:
        events = {event["state"]: event["created_ms"] / 1000 for event in task.get("events") or []}
        out.append(
            {
                "name": task["name"],
                "state": task["state"],
                "pid": task.get("worker_pid"),
                "created": (task.get("creation_time_ms") or 0) / 1000 or None,
                **events,
            }
        )
    return sorted(out, key=lambda task: task.get("created") or 0)


def ray_log_times(logs: str, pattern: str) -> list[float]:
    """Wall-clock times (ms resolution) of the driver's Ray log lines that match ``pattern``."""
    times = []
    for line in logs.splitlines():
        if re.search(pattern, line) and (match := _RAY_TIME.search(line)):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
            times.append(stamp.timestamp() + int(match.group(2)) / 1000)
    return times


# vLLM's log prefix: "INFO 11-22 02:34:39 [core.py:402] ..." (local time, no year, 1 s resolution)
_VLLM_TIME = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[")


def _engine_ready_from_log(logs: str) -> float | None:
    """Fallback without the state API: the last vLLM timestamp before Ray Data LLM's end-of-__init__ line."""
    last = None
    for line in logs.splitlines():
        if match := _VLLM_TIME.search(line):
            month, day, hour, minute, second = map(int, match.groups())
            last = datetime(datetime.now().year, month, day, hour, minute, second).timestamp()
        elif "Max pending requests is set to" in line:
            return last
    return None


def ours_result(
    *,
    t_submit: float,
    t_submitted: float,
    job_start: float,
    job_end: float,
    manifest: dict[str, Any],  # Any: JSON values.
    manifest_mtime: float,
    logs: str,
    tasks: list[dict[str, Any]],  # Any: JSON values.
    parts: list[dict[str, Any]],  # Any: JSON values.
) -> dict[str, Any]:  # Any: JSON values.
    """(b)'s row; every time is relative to ``t_submit`` (just before the operator started submitting)."""

    def after_submit(t: float | None) -> float | None:
        return None if t is None else t - t_submit

    # A head that stays up between runs lists earlier jobs' actors too: keep this job's (created later).
    tasks = [t for t in tasks if (t.get("created") or 0) >= t_submit]
    engine = next((t for t in tasks if "vLLMEngineStage" in t["name"]), {})
    driver = ray_log_times(logs, r"Connected to Ray cluster")
    datasets = ray_log_times(logs, r"Starting execution of Dataset")
    first_part = parts[0]["mtime"] if parts else None
    last_part = parts[-1]["mtime"] if parts else None
    engine_ready = engine.get("FINISHED") or _engine_ready_from_log(logs)
    result: dict[str, Any] = {  # Any: JSON values.
        "t_submit_epoch": t_submit,
        "end_to_end_s": manifest_mtime - t_submit,
        "job_end_s": job_end - t_submit,
        "submit_call_s": t_submitted - t_submit,
        "job_start_after_submit_s": job_start - t_submit,
        "driver_connected_after_submit_s": after_submit(driver[0] if driver else None),
        "llm_dataset_start_after_submit_s": after_submit(datasets[-1] if datasets else None),
        "engine_actor_requested_after_submit_s": after_submit(engine.get("created")),
        "engine_init_start_after_submit_s": after_submit(engine.get("RUNNING")),
        "engine_ready_after_submit_s": after_submit(engine_ready),
        "first_part_after_submit_s": after_submit(first_part),
        "last_part_after_submit_s": after_submit(last_part),
        "commit_s": None if last_part is None else manifest_mtime - last_part,
        "manifest_to_job_end_s": job_end - manifest_mtime,
        "other_actor_inits_s": {
            t["name"].split(".")[0][:60]: round(t["FINISHED"] - t["RUNNING"], 1)
            for t in tasks
            if t.get("RUNNING") and t.get("FINISHED") and t is not engine
        },
        "rows": manifest["rows_in"],
        "tokens_in": manifest["tokens_in"],
        "tokens_out": manifest["tokens_out"],
        "manifest_wall_seconds": manifest["wall_seconds"],
        "parts": len(parts),
    }
    if engine.get("RUNNING") and engine_ready:
        result["engine_start_s"] = engine_ready - engine["RUNNING"]
    if engine_ready and last_part:
        result["startup_s"] = engine_ready - t_submit
        result["generating_s"] = last_part - engine_ready
    return add_rates(result)


_ROWS = [
    ("wall, start -> outputs written (s)", "end_to_end_s", "{:.1f}"),
    ("  start-up before generating (s)", "startup_s", "{:.1f}"),
    ("  engine start: import vLLM + build engine (s)", "engine_start_s", "{:.1f}"),
    ("  generating (s)", "generating_s", "{:.1f}"),
    ("output tokens", "tokens_out", "{:d}"),
    ("output tok/s end to end", "out_tok_per_s_end_to_end", "{:.1f}"),
    ("output tok/s while generating", "out_tok_per_s_generating", "{:.1f}"),
]


def table(
    raw: dict[str, Any] | None, ours: dict[str, Any] | None, extra_rows: tuple = ()
) -> str:  # Any: JSON
    """The compare table in Markdown; b/a for every numeric row."""
    lines = ["| | (a) raw vLLM | (b) ours (Ray job) | b/a |", "|---|---|---|---|"]
    for label, key, fmt in (*_ROWS, *extra_rows):
        a = raw.get(key) if raw else None
        b = ours.get(key) if ours else None
        ratio = f"{b / a:.2f}" if isinstance(a, int | float) and isinstance(b, int | float) and a else ""
        lines.append(
            f"| {label} | {fmt.format(a) if a is not None else '-'} | "
            f"{fmt.format(b) if b is not None else '-'} | {ratio} |"
        )
    return "\n".join(lines)


def ratios(raw: dict[str, Any], ours: dict[str, Any]) -> dict[str, float | None]:  # Any: JSON values.
    def ratio(key: str) -> float | None:
        a, b = raw.get(key), ours.get(key)
        return b / a if a and b is not None else None

    return {
        "end_to_end": ratio("end_to_end_s"),
        "generating": ratio("generating_s"),
        "startup": ratio("startup_s"),
        "out_tok_per_s_generating": ratio("out_tok_per_s_generating"),
    }
