"""The adapter's files: the request lines it writes for the job, and the result lines it reads back.

Local paths directly; ``s3://`` through Airflow's ObjectStoragePath (the default AWS connection, as
the job's own S3 access is the cluster's). Both are JSONL, read and written a line at a time, so a
large batch never sits in memory as one string.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from airflow_provider_raybatch.shared.json_types import JsonObject


def _path(uri: str) -> Path | Any:  # Any: Airflow's ObjectStoragePath.
    if "://" not in uri:
        return Path(uri)
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def write_lines(uri: str, lines: Iterable[JsonObject]) -> int:
    """Write one JSON object per line (replacing the file); returns the number of lines.

    A local file is written beside its name and renamed onto it: the folder is under common.ai's
    ``result_path``, named with no secret, and whoever can write there could have put a link at the
    name, which opening it for writing would follow to any file the worker can write."""
    path = _path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(path, Path):
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                count = _write(file, lines)
            os.chmod(temporary, 0o644)  # the job reads it, perhaps as another user on a local cluster
            os.replace(temporary, path)  # replaces a link at the name, never writes through it
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return count
    with path.open("w", encoding="utf-8") as file:
        return _write(file, lines)


def _write(file: IO[str], lines: Iterable[JsonObject]) -> int:
    count = 0
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
