"""The one shape of trigger events in this provider, and its check on the receiving side."""

from __future__ import annotations

import re

from airflow_provider_raybatch.shared.exceptions import RayJobFailedError, RayTriggerEventError
from airflow_provider_raybatch.shared.json_types import JsonValue

EVENT_STATUSES = frozenset({"success", "error", "cancelled"})
EVENT_KEYS = ("status", "job_id", "message", "termination_reason")
#: How Ray's message of a failed entrypoint starts the log lines it quotes (job_supervisor.py).
_RAY_LOG_TAIL = ", last available logs"


def without_log_tail(message: str) -> str:
    """Ray's job message without the log lines it quotes, for an error that adds the driver log's end
    itself: both made every error show twice. Only then: where the log cannot be
    read (the driver's node gone), Ray's quote is the last copy."""
    head, found, _ = message.partition(_RAY_LOG_TAIL)
    return f"{head}." if found else message


def job_event(status: str, job_id: str, message: str, termination_reason: str) -> dict[str, str]:
    """Build an event payload; every trigger of the provider emits exactly these keys."""
    if status not in EVENT_STATUSES:
        raise ValueError(f"status={status!r} is not one of {sorted(EVENT_STATUSES)}.")
    return {"status": status, "job_id": job_id, "message": message, "termination_reason": termination_reason}


def validate_event(event: JsonValue) -> dict[str, str]:
    """Reject a missing or malformed event with a clear message before the operator acts on it."""
    if not isinstance(event, dict):
        raise RayTriggerEventError(f"Expected a trigger event dict, got {type(event).__name__}: {event!r}.")
    missing = [key for key in EVENT_KEYS if key not in event]
    if missing:
        raise RayTriggerEventError(f"Trigger event lacks keys {missing}: {event!r}.")
    if event["status"] not in EVENT_STATUSES:
        raise RayTriggerEventError(
            f"Trigger event status {event['status']!r} is not one of {sorted(EVENT_STATUSES)}."
        )
    return event


def job_failed_error(event: dict[str, str], log_tail: str) -> RayJobFailedError:
    """The exception that fails a task whose job ended badly: Ray's message, the error the driver
    ended with (else the why was only in the log lines below, a screen down), then the log's end."""
    message = event["message"]
    if log_tail:
        why, message = last_error_line(log_tail), without_log_tail(message).rstrip()
        if why:
            message += f"{'' if message.endswith('.') else '.'} Why: {why}"
        message += f"\n--- last lines of the Ray job's driver log ---\n{log_tail}"
    return RayJobFailedError(message, job_id=event["job_id"], status=event["termination_reason"])


#: A traceback's closing line: an exception's (dotted) class name, a colon, its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Failed|Lost)): (.+)$")


def last_error_line(log: str) -> str | None:
    """The last exception a log's traceback ends with, as ``Name: message`` (no module path), or None."""
    for line in reversed(log.splitlines()):
        if found := _EXCEPTION_LINE.match(line.strip()):
            return f"{found.group(1)}: {found.group(2)}"
    return None
