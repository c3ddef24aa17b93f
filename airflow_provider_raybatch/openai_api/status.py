"""A batch's OpenAI status, read from its Airflow DAG run and task instance.

Each batch is one run of the provider's batch DAG (:mod:`.dag`), whose run id is the batch id:

=============  ===========================================================================
validating     the run is queued, or its batch task has not started yet
in_progress    the batch task runs or waits for its Ray job (deferred, up for retry)
finalizing     the batch task succeeded; Airflow has not closed the run yet
completed      the run succeeded
failed         the run failed (and nobody cancelled it)
cancelling     cancel was asked; the run has not stopped yet
cancelled      cancel was asked and the run stopped
expired        the completion window passed before the run finished (it is then cancelled)
=============  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

BatchStatus = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled", "expired"
]
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "expired"})
_WAITING_TASK_STATES = frozenset({None, "none", "scheduled", "queued"})


@dataclass(frozen=True)
class RunState:
    """What the status needs of the DAG run and its batch task (None: not created yet)."""

    run_state: str | None
    run_start: datetime | None = None
    run_end: datetime | None = None
    task_state: str | None = None
    task_start: datetime | None = None
    task_end: datetime | None = None


def _epoch(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def batch_status(
    record: dict[str, Any], run: RunState
) -> tuple[BatchStatus, dict[str, int | None]]:  # Any: JSON.
    """The batch's status and its ``*_at`` timestamps (Unix seconds, None until reached)."""
    times: dict[str, int | None] = {
        "in_progress_at": _epoch(run.task_start),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "cancelling_at": record.get("cancelling_at"),
        "cancelled_at": None,
        "expired_at": record.get("expired_at"),
    }
    ended = run.run_state in ("success", "failed")
    if record.get("expired_at") is not None and (ended or run.run_state is None):
        return "expired", times
    if record.get("cancelling_at") is not None:
        if ended or run.run_state is None:
            times["cancelled_at"] = _epoch(run.run_end) or record["cancelling_at"]
            return "cancelled", times
        return "cancelling", times
    if run.run_state == "success":
        times["finalizing_at"] = _epoch(run.task_end)
        times["completed_at"] = _epoch(run.run_end)
        return "completed", times
    if run.run_state == "failed" or run.run_state is None:
        times["failed_at"] = _epoch(run.run_end) or record["created_at"]
        return "failed", times
    if run.task_state == "success":
        times["finalizing_at"] = _epoch(run.task_end)
        return "finalizing", times
    if run.run_state == "queued" or run.task_state in _WAITING_TASK_STATES:
        return "validating", times
    return "in_progress", times
