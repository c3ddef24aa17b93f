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
expired        the completion window passed before the run succeeded (the batch task's deadline is
               the window's end, so its job is stopped then; reading a batch never changes it)
=============  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from airflow_provider_raybatch.shared.json_types import JsonObject

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


def _expired_at(record: JsonObject, run: RunState, now: float) -> int | None:
    """When the batch expired: its window ended before its run did, and the run did not succeed."""
    if record.get("expired_at") is not None:  # written by an earlier version of this API
        return int(record["expired_at"])
    expires_at = int(record["expires_at"])
    if now <= expires_at or run.run_state == "success":
        return None
    if run.run_state in (None, "failed") and (run.run_end is None or run.run_end.timestamp() >= expires_at):
        return expires_at
    return None  # still running past its window: its task's deadline is stopping it


def batch_status(record: JsonObject, run: RunState, now: float) -> tuple[BatchStatus, dict[str, int | None]]:
    """The batch's status at ``now`` and its ``*_at`` timestamps (Unix seconds, None until reached)."""
    if run.task_state == "failed" and run.run_state not in ("success", "failed"):
        # The batch task is the run's only task and "failed" is final (a retry is "up_for_retry"):
        # the run is failed, though the scheduler may take a few seconds to close it.
        run = replace(run, run_state="failed", run_end=run.run_end or run.task_end)
    expired_at = _expired_at(record, run, now)
    times: dict[str, int | None] = {
        "in_progress_at": _epoch(run.task_start),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "cancelling_at": record.get("cancelling_at"),
        "cancelled_at": None,
        "expired_at": None,
    }
    ended = run.run_state in ("success", "failed")
    legacy_expiry = record.get("expired_at") is not None  # that version also set cancelling_at
    if (
        expired_at is not None
        and (ended or run.run_state is None)
        and (legacy_expiry or record.get("cancelling_at") is None)
    ):
        times["expired_at"] = expired_at
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
