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
    result = {
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
    if (
        "t_prepared" in raw
    ):  # the customers workload: rows prepared in worker processes beside the engine start
        result.update(
            read_s=raw["t_read_done"] - t_launch,
            # > 0: the engine start hid the preparing; < 0: the engine waited for the rows
            prepare_slack_s=raw["t_engine_ready"] - raw["t_prepared"],
            prepared_after_launch_s=raw["t_prepared"] - t_launch,
            dedupe_s=raw["t_deduped"] - raw["t_prepared"],
            rows_in=raw["rows_in"],
            rows_per_s_end_to_end=raw["rows_in"] / (raw["t_outputs_written"] - t_launch),
        )
        for key in (
            "rows_rejected_before_engine",
            "errors_by_reason",
            "finish_reasons",
            "choice_cut_short",
            "generated_text_counts",
            "workers",
            "generate_chunk",
            "prepare_worker_s",
            "peak_rss_bytes_self",
        ):
            result[key] = raw.get(key)
    return add_rates(result)


def watch_parts(
    is_terminal: Callable[[], bool],
    staging: Path,
    poll_seconds: float = 0.5,
    on_poll: Callable[[dict[str, dict[str, Any]]], None] | None = None,  # Any: JSON values.
    known: dict[str, dict[str, Any]] | None = None,  # Any: JSON values.
) -> list[dict[str, Any]]:  # Any: JSON values.
    """Poll until ``is_terminal()``, recording each staged part sidecar (pipeline/stage/parts.py) as it
    appears.

    :param on_poll: called after each look with every part seen so far (by sidecar name).
    :param known: parts seen before (e.g. by an earlier job of the same staging): not reported again.
    """
    parts: dict[str, dict[str, Any]] = {}  # Any: JSON values.
    before = known or {}
    while True:
        done = is_terminal()
        for path in (staging / "parts").glob("*.json"):
            if path.name in parts or path.name in before:
                continue
            try:
                sidecar = json.loads(path.read_text())
                mtime = path.stat().st_mtime
            except (OSError, json.JSONDecodeError):
                continue  # removed by the commit, or not yet whole
            written_at = sidecar.get("written_at")
            parts[path.name] = {
                "name": path.name,
                "seen": time.time(),
                "mtime": mtime,
                "written_at": _iso_epoch(written_at) if isinstance(written_at, str) else None,
                "tokens_out": sidecar["tokens_out"],
                "rows": sidecar["rows_out"] + sidecar["rows_failed"],
                "files": len(sidecar.get("files") or {}),
            }
        if on_poll is not None:
            on_poll(parts)
        if done:
            return sorted(parts.values(), key=lambda part: part["mtime"])
        time.sleep(poll_seconds)


def _iso_epoch(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


# Ray Data's driver log lines about each dataset execution (Ray 2.57 and 2.60).
_DATASET_START = re.compile(r"Starting execution of Dataset (\S+?)\.? ")
_DATASET_PLAN = re.compile(r"Execution plan of Dataset (\S+?): (.*)$")
_DATASET_DONE = re.compile(r"Dataset (\S+) execution finished in ([0-9.]+) seconds")


def dataset_executions(logs: str) -> list[dict[str, Any]]:  # Any: JSON values.
    """Each Ray Data execution the driver logged, in order: name, start, end (epoch), seconds, plan, kind.

    kind: ``read_prepare`` (the plan reads files), ``read_kept`` (a retry reads the prepared rows an
    earlier try kept, pipeline/read/prepared_cache.py), ``keep_prepared`` (the first try writes them),
    ``llm`` (the ray.data.llm processor: the engine's), ``stage_rejected`` (a write: the rows rejected
    before the engine), else ``dedupe_count`` (the duplicate-id scan, counts, the resume filter).
    """
    executions: dict[str, dict[str, Any]] = {}  # Any: JSON values.
    for line in logs.splitlines():
        stamp = _RAY_TIME.search(line)
        if not stamp:
            continue
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(stamp.group(2)) / 1000
        if match := _DATASET_START.search(line):
            executions.setdefault(match.group(1), {"name": match.group(1), "start": when})
        elif match := _DATASET_PLAN.search(line):
            executions.setdefault(match.group(1), {"name": match.group(1), "start": when})["plan"] = (
                match.group(2)[:400]
            )
        elif match := _DATASET_DONE.search(line):
            entry = executions.setdefault(match.group(1), {"name": match.group(1)})
            entry.update(end=when, seconds=float(match.group(2)))
    out = sorted(executions.values(), key=lambda e: e.get("start") or e.get("end") or 0)
    for entry in out:
        plan = entry.get("plan", "")
        entry["kind"] = (
            "read_kept"
            if "Parquet" in plan and "ReadBinary" not in plan  # ReadParquet; Ray 2.57: ReadFilesParquetV2
            else "keep_prepared"
            if "_nulls_as_text" in plan
            else "read_prepare"
            if "ReadBinary" in plan or "ReadFiles" in plan
            else "llm"
            if "vLLMEngine" in plan or "ChatTemplate" in plan or "Tokenize" in plan
            else "stage_rejected"
            if "Write" in plan
            else "dedupe_count"
        )
    return out


def scale_phases(
    logs: str,
    t_submit: float,
    job_start: float,
    job_end: float,
    parts: list[dict[str, Any]],  # Any: JSON values.
    manifest_mtime: float | None,
    report_mtime: float | None = None,
) -> dict[str, Any]:  # Any: JSON values.
    """Where a job's time went outside the engine, from its driver log and its staged parts (seconds).

    ``before_engine_fed_s``: submit -> the ray.data.llm dataset starts (runtime env, driver start, read,
    prepare, duplicate scan, counts, staging the rejected rows); ``commit_s``: that dataset finished ->
    manifest.json (folding the sidecars, the report, the manifest), ``report_to_manifest_s`` its last step.
    """
    executions = dataset_executions(logs)
    connected = ray_log_times(logs, r"Connected to Ray cluster")
    llm = [e for e in executions if e["kind"] == "llm"]
    llm_start = llm[-1].get("start") if llm else None
    llm_end = llm[-1].get("end") if llm else None

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t_submit, 3)

    def total(kind: str) -> float:
        return round(sum(e.get("seconds") or 0 for e in executions if e["kind"] == kind), 3)

    def when(part: dict[str, Any]) -> float:  # Any: JSON values.
        return part["written_at"] or part["mtime"]

    first_part = min((when(p) for p in parts), default=None)
    # The rows rejected before the engine are staged before the ray.data.llm dataset starts.
    engine_parts = [p for p in parts if llm_start is None or when(p) >= llm_start]
    first_engine_part = min((when(p) for p in engine_parts), default=None)
    last_part = max((when(p) for p in parts), default=None)
    return {
        "submit_to_job_start_s": rel(job_start),
        "submit_to_driver_connected_s": rel(connected[0] if connected else None),
        "read_prepare_s": total("read_prepare"),
        "dedupe_count_s": total("dedupe_count"),
        "stage_rejected_s": total("stage_rejected"),
        "keep_prepared_s": total("keep_prepared"),
        "read_kept_s": total("read_kept"),
        "submit_to_llm_dataset_start_s": rel(llm_start),
        "before_engine_fed_s": rel(llm_start),
        "submit_to_first_part_s": rel(first_part),
        "submit_to_first_engine_part_s": rel(first_engine_part),
        "submit_to_last_part_s": rel(last_part),
        # generating: the engine's first part -> its last (the replica stages every half batch)
        "first_to_last_part_s": None
        if first_engine_part is None or last_part is None
        else round(last_part - first_engine_part, 3),
        "engine_part_rows": sum(p["rows"] for p in engine_parts),
        "llm_dataset_s": (llm[-1].get("seconds") if llm else None),
        "submit_to_llm_dataset_end_s": rel(llm_end),
        "commit_s": None if llm_end is None or manifest_mtime is None else round(manifest_mtime - llm_end, 3),
        "last_part_to_manifest_s": None
        if last_part is None or manifest_mtime is None
        else round(manifest_mtime - last_part, 3),
        "report_to_manifest_s": None
        if report_mtime is None or manifest_mtime is None
        else round(manifest_mtime - report_mtime, 3),
        "manifest_to_job_end_s": None if manifest_mtime is None else round(job_end - manifest_mtime, 3),
        "datasets": [
            {
                "name": e["name"],
                "kind": e["kind"],
                "start_s": rel(e.get("start")),
                "seconds": e.get("seconds"),
                "plan": e.get("plan", "")[:200],
            }
            for e in executions
        ],
    }


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
        # A dry run's manifest has prompt tokens and no output or wall (pipeline/dry_run.py).
        "tokens_in": manifest.get("tokens_in", manifest.get("prompt_tokens")),
        "tokens_out": manifest.get("tokens_out", 0),
        "manifest_wall_seconds": manifest.get("wall_seconds"),
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
