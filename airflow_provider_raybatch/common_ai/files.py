"""The adapter's files: the request lines it writes for the job, and the result lines it reads back.

Local paths directly; ``s3://`` through Airflow's ObjectStoragePath (the default AWS connection, as
the job's own S3 access is the cluster's). Both are JSONL, read and written a line at a time, so a
large batch never sits in memory as one string.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def _path(uri: str) -> Path | Any:  # Any: Airflow's ObjectStoragePath.
    if "://" not in uri:
        return Path(uri)
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def write_lines(uri: str, lines: Iterable[dict[str, Any]]) -> int:  # Any: JSON values.
    """Write one JSON object per line (replacing the file); returns the number of lines."""
    path = _path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as file:
        for line in lines:
            file.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    return count


def iter_result_lines(*folders: str) -> Iterator[tuple[str, str]]:
    """(``<file>:<line number>``, text) of every non-empty line of the ``.jsonl`` files in ``folders``,
    folder by folder and file by file in name order (a committed version's outputs, then its errors)."""
    for folder in folders:
        directory = _path(folder)
        if not directory.exists():
            continue
        files = sorted((p for p in directory.iterdir() if p.name.endswith(".jsonl")), key=lambda p: p.name)
        for file in files:
            with file.open("r", encoding="utf-8") as handle:
                for number, text in enumerate(handle, start=1):
                    if text.strip():
                        yield f"{file.name}:{number}", text
