"""What the pipeline (cluster) hands the operator (Airflow) through the driver log: the manifest and progress.

The pipeline writes ``manifest.json`` beside the outputs and also prints it on one marked line of
the driver log, so the operator can read it through the Jobs API without storage credentials.
While it runs, it prints a marked progress line now and then, which the trigger turns into a
readable line of the task log.
"""

from __future__ import annotations

import json
from typing import Any

MANIFEST_FILE_NAME = "manifest.json"
MANIFEST_LOG_MARKER = "RAYBATCH_MANIFEST_JSON="
PROGRESS_LOG_MARKER = "RAYBATCH_PROGRESS_JSON="


def manifest_log_line(manifest: dict[str, Any]) -> str:  # Any: JSON values.
    """The single log line that carries the manifest."""
    return MANIFEST_LOG_MARKER + json.dumps(manifest, sort_keys=True, separators=(",", ":"))


def progress_log_line(progress: dict[str, Any]) -> str:  # Any: JSON values.
    """The log line that carries one progress snapshot (see :func:`describe_progress`)."""
    return PROGRESS_LOG_MARKER + json.dumps(progress, sort_keys=True, separators=(",", ":"))


def _last_marked(log: str, marker: str) -> dict[str, Any] | None:  # Any: JSON values.
    # Searched from the end, not split into lines: the trigger reads a whole driver log (hundreds of
    # KiB) for each progress line, hundreds of triggers per triggerer (bench/RESULTS.md, section 3).
    end = len(log)
    while (start := log.rfind(marker, 0, end)) >= 0:
        line_end = log.find("\n", start)
        # The rest of the marker's line; splitlines() also ends it at "\r" and the like, as before.
        payload = log[start + len(marker) : None if line_end < 0 else line_end].splitlines()
        try:
            return json.loads(payload[0] if payload else "")
        except json.JSONDecodeError:
            end = start  # a line cut short in the log; an earlier complete one may follow
    return None


def manifest_from_log(log: str) -> dict[str, Any] | None:  # Any: JSON values.
    """The last manifest printed in a driver log, or None when the job printed none."""
    return _last_marked(log, MANIFEST_LOG_MARKER)


def progress_from_log(log: str) -> dict[str, Any] | None:  # Any: JSON values.
    """The latest progress snapshot printed in a driver log, or None before the first."""
    return _last_marked(log, PROGRESS_LOG_MARKER)


def describe_progress(progress: dict[str, Any]) -> str:  # Any: JSON values.
    """One line for the task log, e.g. ``1,200 / 5,000 rows (24.0%), 35.1 rows/s, 210 output tokens/s, ETA 1m48s``.

    Rates count only this run's rows (not those resumed from an earlier try) over this run's time.
    """
    done, total = int(progress["rows_done"]), int(progress["rows_total"])
    resumed, elapsed = int(progress.get("rows_resumed", 0)), float(progress["elapsed_seconds"])
    share = f" ({100 * done / total:.1f}%)" if total else ""
    line = f"{done:,} / {total:,} rows{share}"
    if elapsed <= 0:
        return line
    rows_per_second = (done - resumed) / elapsed
    line += f", {rows_per_second:.1f} rows/s, {float(progress.get('tokens_out', 0)) / elapsed:,.0f} output tokens/s"
    if rows_per_second > 0 and total > done:
        line += f", ETA {_duration((total - done) / rows_per_second)}"
    return line


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
