"""Tests of airflow_provider_raybatch/utils/events.py: the one event shape and its check."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_raybatch.shared.exceptions import RayJobFailedError, RayTriggerEventError
from airflow_provider_raybatch.utils.events import (
    EVENT_KEYS,
    EVENT_STATUSES,
    job_event,
    job_failed_error,
    validate_event,
)


def test_job_event_has_exactly_the_event_keys() -> None:
    event = job_event("success", "job-1", "Ray job job-1 finished: SUCCEEDED.", "succeeded")

    assert tuple(event) == EVENT_KEYS
    assert event == {
        "status": "success",
        "job_id": "job-1",
        "message": "Ray job job-1 finished: SUCCEEDED.",
        "termination_reason": "succeeded",
    }


def test_job_event_rejects_unknown_status() -> None:
    with pytest.raises(ValueError, match="'failed'"):
        job_event("failed", "job-1", "m", "failed")


@pytest.mark.parametrize("status", sorted(EVENT_STATUSES))
def test_validate_event_accepts_every_status(status: str) -> None:
    event = job_event(status, "job-1", "m", "r")

    assert validate_event(event) == event


@pytest.mark.parametrize("event", [None, "success", ["success"], 3])
def test_validate_event_rejects_non_dicts(event: Any) -> None:  # Any: the malformed input.
    with pytest.raises(RayTriggerEventError, match="Expected a trigger event dict"):
        validate_event(event)


@pytest.mark.parametrize("missing", EVENT_KEYS)
def test_validate_event_names_missing_keys(missing: str) -> None:
    event = job_event("error", "job-1", "m", "failed")
    del event[missing]

    with pytest.raises(RayTriggerEventError, match=f"lacks keys \\['{missing}'\\]"):
        validate_event(event)


def test_validate_event_rejects_unknown_status() -> None:
    event = {**job_event("error", "job-1", "m", "failed"), "status": "failed"}

    with pytest.raises(RayTriggerEventError, match="'failed'"):
        validate_event(event)


def test_job_failed_error_carries_job_status_and_log_tail() -> None:
    event = job_event("error", "job-7", "Ray job job-7 finished: FAILED.", "failed")

    error = job_failed_error(event, "Traceback (most recent call last):\nValueError: boom")

    assert isinstance(error, RayJobFailedError)
    assert error.job_id == "job-7"
    assert error.status == "failed"
    message = str(error)
    assert message.startswith("Ray job job-7 finished: FAILED. Why: ValueError: boom\n")
    assert "last lines of the Ray job's driver log" in message
    assert message.endswith("ValueError: boom")


def test_the_first_line_of_a_failed_jobs_error_says_why() -> None:
    """A job whose engine could not be built failed the task with "Job entrypoint command
    failed with exit code 1"; the why was in the driver log's last lines below it."""
    tail = (
        "Traceback (most recent call last):\n"
        '  File "run.py", line 390, in run_batch\n'
        "    raise EngineStageFailed(err) from err\n"
        "airflow_provider_raybatch.pipeline.run.EngineStageFailed: The engine stage failed: "
        "EngineBuildError: ValueError: No available memory for the cache blocks.\n"
        "INFO 11-29 09:36:50 shutting down\n"
    )
    first_line = str(job_failed_error(job_event("error", "j", RAY_MESSAGE, "failed"), tail)).splitlines()[0]
    assert first_line == (
        "Ray job j finished: FAILED. Job entrypoint command failed with exit code 1. Why: EngineStageFailed: "
        "The engine stage failed: EngineBuildError: ValueError: No available memory for the cache blocks."
    )


def test_job_failed_error_without_log_tail_is_just_the_message() -> None:
    event = job_event("cancelled", "job-8", "Ray job job-8 finished: STOPPED.", "stopped")

    error = job_failed_error(event, "")

    assert str(error) == "Ray job job-8 finished: STOPPED."
    assert error.status == "stopped"


RAY_MESSAGE = (
    "Ray job j finished: FAILED. Job entrypoint command failed with exit code 1, last available logs "
    "(truncated to 20,000 chars):\nERROR 30 of 30 rows failed\n"
)


def test_job_failed_error_quotes_the_log_once() -> None:
    """Ray's message quotes the log's end, and the error adds it itself: every error showed twice."""
    event = job_event("error", "j", RAY_MESSAGE, "failed")

    error = str(job_failed_error(event, "ERROR 30 of 30 rows failed"))

    assert error.count("ERROR 30 of 30 rows failed") == 1
    assert error.startswith("Ray job j finished: FAILED. Job entrypoint command failed with exit code 1.\n")


def test_job_failed_error_keeps_rays_quote_when_the_log_cannot_be_read() -> None:
    """The driver's node gone, the log unreadable: Ray's quote is the last copy."""
    assert "ERROR 30 of 30 rows failed" in str(
        job_failed_error(job_event("error", "j", RAY_MESSAGE, "failed"), "")
    )
