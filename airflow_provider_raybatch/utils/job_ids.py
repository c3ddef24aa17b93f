"""Deterministic Ray submission ids and job metadata derived from an Airflow task-instance try."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
SUBMISSION_ID_PREFIX = "raybatch"
_MAX_PART_LENGTH = 40
_RUN_KEYS = ("airflow_dag_id", "airflow_run_id", "airflow_task_id", "airflow_map_index")


@dataclass(frozen=True)
class TaskTry:
    """Which task-instance try a Ray job belongs to."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int

    def submission_id(self) -> str:
        """``raybatch-<dag>-<task>-<run>-m<map index>-t<try>-<hash>``: readable, URL-safe, unique.

        The parts are shortened and cleaned for readability; the hash of the exact values keeps two
        runs whose cleaned names collide apart.
        """
        exact = "\x1f".join(map(str, (self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number)))
        digest = hashlib.sha256(exact.encode()).hexdigest()[:10]
        parts = [_clean(self.dag_id), _clean(self.task_id), _clean(self.run_id)]
        return "-".join([SUBMISSION_ID_PREFIX, *parts, f"m{self.map_index}", f"t{self.try_number}", digest])

    def run_key(self) -> str:
        """The logical run's identity, without the try: every retry of it shares this key.

        ``<task id, cleaned, at most 24 characters>-m<map index>-<hash>``. It names the staging folder a
        retry resumes from, so the key of an id that ever worked must never change. Leading dots are
        dropped from the readable part: a task id Airflow allows may start with ``.``, and the key must
        not (it is a folder name: never ``.`` or ``..``, nor hidden). No key that worked began with a
        dot, so dropping them changes none of those.
        """
        exact = "\x1f".join(map(str, (self.dag_id, self.run_id, self.task_id, self.map_index)))
        readable = _clean(self.task_id)[:24].lstrip(".")
        return f"{readable}-m{self.map_index}-{hashlib.sha256(exact.encode()).hexdigest()[:16]}"

    def owns(self, metadata: dict[str, str]) -> bool:
        """Whether a Ray job's metadata says it belongs to this logical run (any try)."""
        mine = self.metadata()
        return all(metadata.get(key) == mine[key] for key in _RUN_KEYS)

    def metadata(self) -> dict[str, str]:
        """Ray job metadata (string values only) that lets our jobs be found by listing."""
        return {
            "airflow_dag_id": self.dag_id,
            "airflow_run_id": self.run_id,
            "airflow_task_id": self.task_id,
            "airflow_map_index": str(self.map_index),
            "airflow_try_number": str(self.try_number),
        }


def _clean(value: str) -> str:
    return _UNSAFE.sub("_", value).strip("_")[:_MAX_PART_LENGTH]
