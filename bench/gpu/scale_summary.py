"""The scale benchmark's tables (issue 19 items 1 and 5) from the device's result files.

Reads ``a-NAME.json`` (raw vLLM), ``b-NAME.json`` (our job), ``resume-NAME.json`` and ``check-NAME.json``
from a folder (the device's /tmp/keep, or results.tgz unpacked here) and prints Markdown: per workload
raw vs ours (wall, rows/s, the phases outside the engine, peak RSS, spilling, parts and files, commit),
then the resume test.

usage: python3 bench/gpu/scale_summary.py [FOLDER]      (default /tmp/keep)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NAMES = ("scale-2m-small", "scale-200k-8b")


def _load(folder: Path, name: str) -> dict[str, Any] | None:  # Any: JSON.
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(value: Any, digits: int = 1) -> str:  # Any: a JSON value.
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _rss(result: dict[str, Any] | None, group: str, key: str = "peak_rss_mib") -> Any:  # Any: JSON.
    groups = ((result or {}).get("rss") or {}).get("groups") or {}
    return (groups.get(group) or {}).get(key)


def pair_table(name: str, raw: dict[str, Any] | None, ours: dict[str, Any] | None) -> str:  # Any: JSON.
    phase = (ours or {}).get("phases") or {}
    manifest = (ours or {}).get("manifest") or {}
    store = (ours or {}).get("object_store") or {}
    files = (ours or {}).get("files") or {}
    raw = raw or {}
    rows = [
        ("rows in", raw.get("rows_in"), manifest.get("rows_in")),
        ("rows generated (raw) / out (ours)", raw.get("rows"), manifest.get("rows_out")),
        (
            "rows failed (duplicates among them)",
            raw.get("rows_rejected_before_engine"),
            f"{_fmt(manifest.get('rows_failed'))} ({_fmt(manifest.get('rows_duplicate'))})",
        ),
        ("wall: start -> outputs written (s)", raw.get("end_to_end_s"), ours and ours.get("end_to_end_s")),
        ("rows/s end to end", raw.get("rows_per_s_end_to_end"), ours and ours.get("rows_per_s_end_to_end")),
        (
            "generating (s): raw generate() / ours first -> last part",
            raw.get("generating_s"),
            phase.get("first_to_last_part_s"),
        ),
        (
            "rows/s while generating",
            (raw.get("rows") or 0) / raw["generating_s"] if raw.get("generating_s") else None,
            ours and ours.get("rows_per_s_generating"),
        ),
        ("engine start: import + build (s)", raw.get("engine_start_s"), ours and ours.get("engine_start_s")),
        (
            "start -> engine fed (s): raw generate() / ours LLM dataset",
            raw.get("startup_s"),
            phase.get("before_engine_fed_s"),
        ),
        (
            "  raw: read files / rows prepared (workers, beside the engine start) (s)",
            f"{_fmt(raw.get('read_s'))} / {_fmt(raw.get('prepared_after_launch_s'))}",
            None,
        ),
        ("  ours: submit -> driver connected (s)", None, phase.get("submit_to_driver_connected_s")),
        ("  ours: read + prepare (s)", None, phase.get("read_prepare_s")),
        (
            "  ours: duplicate scan, counts, resume filter (s)",
            raw.get("dedupe_s"),
            phase.get("dedupe_count_s"),
        ),
        ("  ours: stage the rejected rows (s)", None, phase.get("stage_rejected_s")),
        ("start -> first output staged (s)", None, phase.get("submit_to_first_engine_part_s")),
        (
            "commit: engine done -> manifest (report -> manifest) / raw: write outputs (s)",
            raw.get("write_s"),
            f"{_fmt(phase.get('commit_s'), 2)} ({_fmt(phase.get('report_to_manifest_s'), 2)})",
        ),
        ("manifest -> job end (s)", None, phase.get("manifest_to_job_end_s")),
        ("driver / raw process peak RSS (MiB)", _rss(raw, "raw"), _rss(ours, "driver")),
        (
            "Ray workers: largest peak / peak sum (MiB)",
            None,
            f"{_fmt(_rss(ours, 'ray_worker'))} / {_fmt(_rss(ours, 'ray_worker', 'peak_sum_rss_mib'))}",
        ),
        (
            "raw prepare workers: largest / sum (MiB)",
            f"{_fmt(_rss(raw, 'mp_child'))} / {_fmt(_rss(raw, 'mp_child', 'peak_sum_rss_mib'))}",
            None,
        ),
        ("EngineCore peak RSS (MiB)", _rss(raw, "engine_core"), _rss(ours, "engine_core")),
        (
            "machine memory used, peak above start (MiB)",
            (raw.get("rss") or {}).get("machine_used_peak_above_start_mib"),
            ((ours or {}).get("rss") or {}).get("machine_used_peak_above_start_mib"),
        ),
        ("object store spilled (MiB)", None, store.get("spilled_mib_this_job")),
        (
            "parts staged / files written (data + sidecars)",
            None,
            f"{_fmt((ours or {}).get('parts_staged'))} / {_fmt((ours or {}).get('part_files_written'))}",
        ),
        (
            "version files: outputs / errors",
            "1 / 0",
            f"{_fmt(files.get('outputs_files'))} / {_fmt(files.get('errors_files'))}",
        ),
        (
            "engine running reqs p50 / max (vLLM stats lines)",
            None,
            "{p50} / {max}".format(**(ours or {}).get("engine_running_reqs"))
            if (ours or {}).get("engine_running_reqs")
            else None,
        ),
        ("output tokens", raw.get("tokens_out"), ours and ours.get("tokens_out")),
    ]
    lines = [f"### {name}", "", "| | (a) raw vLLM | (b) ours (Ray job) |", "|---|---|---|"]
    for label, a, b in rows:
        lines.append(f"| {label} | {_fmt(a)} | {_fmt(b)} |")
    return "\n".join(lines)


def _join(*values: Any) -> str:  # Any: JSON values.
    return " / ".join(_fmt(value) for value in values)


def resume_table(name: str, resume: dict[str, Any]) -> str:  # Any: JSON.
    first, rerun = resume.get("first") or {}, resume.get("rerun") or {}
    manifest = rerun.get("manifest") or {}
    check = resume.get("id_check") or {}
    phase = rerun.get("phases") or {}
    rows = [
        (
            "first job: submit -> stop (s) / rows staged at the stop / in the end",
            _join(
                first.get("submit_to_stop_s"),
                first.get("rows_staged_at_stop"),
                first.get("rows_staged_in_the_end"),
            ),
        ),
        (
            "first job: status / stop -> stopped (s)",
            _join(first.get("status"), first.get("stop_to_stopped_s")),
        ),
        (
            "rerun: resubmit -> LLM dataset starts (engine fed) (s) [target < 30]",
            rerun.get("resubmit_to_llm_dataset_start_s"),
        ),
        (
            "rerun: resubmit -> engine __init__ / ready (s)",
            _join(rerun.get("resubmit_to_engine_init_s"), rerun.get("resubmit_to_engine_ready_s")),
        ),
        ("rerun: resubmit -> first new part (s)", rerun.get("resubmit_to_first_new_part_s")),
        (
            "rerun: read + prepare / dedupe, counts, resume filter (s)",
            _join(phase.get("read_prepare_s"), phase.get("dedupe_count_s")),
        ),
        ("rerun: resubmit -> manifest (s) / status", _join(rerun.get("wall_s"), rerun.get("status"))),
        (
            "manifest rows_in / rows_out / rows_failed / rows_resumed",
            _join(*(manifest.get(key) for key in ("rows_in", "rows_out", "rows_failed", "rows_resumed"))),
        ),
        ("every row exactly once (outputs + errors vs the input)", check.get("every_row_exactly_once")),
        (
            "  outputs / errors / input rows",
            _join(check.get("outputs"), check.get("errors"), check.get("input_rows")),
        ),
        (
            "  ids twice in outputs / sources twice in errors / missing",
            _join(
                check.get("ids_twice_in_outputs"),
                check.get("sources_twice_in_errors"),
                check.get("input_keys_missing"),
            ),
        ),
        ("rerun driver peak RSS (MiB)", _rss(rerun, "driver")),
    ]
    lines = [f"### resume: {name}", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {_fmt(value)} |" for label, value in rows]
    return "\n".join(lines)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/keep")
    for name in NAMES:
        raw, ours = _load(folder, f"a-{name}.json"), _load(folder, f"b-{name}.json")
        if raw or ours:
            print(pair_table(name, raw, ours) + "\n")
        check = _load(folder, f"check-{name}.json")
        if check:
            print(f"{name} id check: {json.dumps(check)}\n")
    for path in sorted(folder.glob("resume-*.json")):
        print(resume_table(path.stem.removeprefix("resume-"), json.loads(path.read_text())) + "\n")


if __name__ == "__main__":
    main()
