"""The run manifest's hand-over from the pipeline (cluster) to the operator (Airflow).

The pipeline writes ``manifest.json`` beside the outputs and also prints it on one marked line of
the driver log, so the operator can read it through the Jobs API without storage credentials.
"""

from __future__ import annotations

import json
from typing import Any

MANIFEST_FILE_NAME = "manifest.json"
MANIFEST_LOG_MARKER = "RAYBATCH_MANIFEST_JSON="


def manifest_log_line(manifest: dict[str, Any]) -> str:  # Any: JSON values.
    """The single log line that carries the manifest."""
    return MANIFEST_LOG_MARKER + json.dumps(manifest, sort_keys=True, separators=(",", ":"))


def manifest_from_log(log: str) -> dict[str, Any] | None:  # Any: JSON values.
    """The last manifest printed in a driver log, or None when the job printed none."""
    for line in reversed(log.splitlines()):
        _, marker, payload = line.partition(MANIFEST_LOG_MARKER)
        if marker:
            try:
                return json.loads(payload)
            except json.JSONDecodeError:
                continue  # a line cut short in the log; an earlier complete one may follow
    return None
