"""A batch's OpenAI status from its DAG run and batch task (pure; the live path is in
tests/integration/test_openai_batch_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from airflow_provider_raybatch.openai_api.status import RunState, batch_status

T0 = datetime(2026, 11, 22, 6, 0, tzinfo=UTC)
RECORD = {"id": "batch_1", "created_at": int(T0.timestamp()) - 10, "expires_at": int(T0.timestamp()) + 100}
NOW = T0.timestamp() + 50  # inside the window


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(T0.timestamp() + seconds, UTC)


@pytest.mark.parametrize(
    ("run", "record", "expected"),
    [
        (RunState("queued"), {}, "validating"),
        (RunState("running", at(0), task_state="scheduled"), {}, "validating"),
        (RunState("running", at(0), task_state="deferred", task_start=at(1)), {}, "in_progress"),
        (RunState("running", at(0), task_state="up_for_retry", task_start=at(1)), {}, "in_progress"),
        (
            RunState("running", at(0), task_state="success", task_start=at(1), task_end=at(9)),
            {},
            "finalizing",
        ),
        (RunState("success", at(0), at(10), "success", at(1), at(9)), {}, "completed"),
        (RunState("failed", at(0), at(10), "failed", at(1), at(9)), {}, "failed"),
        (RunState(None), {}, "failed"),
        (RunState("running", at(0), task_state="deferred"), {"cancelling_at": 5}, "cancelling"),
        (RunState("failed", at(0), at(10), "failed"), {"cancelling_at": 5}, "cancelled"),
        (RunState("failed", at(0), at(10), "failed"), {"cancelling_at": 5, "expired_at": 4}, "expired"),
        (
            RunState("running", at(0), task_state="deferred"),
            {"expired_at": 4, "cancelling_at": 4},
            "cancelling",
        ),
    ],
)
def test_status_follows_the_run(run: RunState, record: dict, expected: str) -> None:
    assert batch_status({**RECORD, **record}, run, now=NOW)[0] == expected


@pytest.mark.parametrize(
    ("run", "record", "expected"),
    [
        (RunState("failed", at(0), at(101), "failed"), {}, "expired"),  # the task's deadline stopped it
        (RunState(None), {}, "expired"),  # never started in its window
        (RunState("queued"), {}, "validating"),  # its task will refuse to start: not expired yet
        (RunState("failed", at(0), at(60), "failed"), {}, "failed"),  # failed inside the window
        (RunState("running", at(0), task_state="deferred", task_start=at(1)), {}, "in_progress"),
        (RunState("success", at(0), at(102), "success", at(1), at(99)), {}, "completed"),
        (RunState("failed", at(0), at(101), "failed"), {"cancelling_at": 70}, "cancelled"),
    ],
)
def test_past_its_window_a_batch_is_expired_without_anyone_writing(
    run: RunState, record: dict, expected: str
) -> None:
    status, times = batch_status({**RECORD, **record}, run, now=T0.timestamp() + 200)
    assert status == expected
    assert (times["expired_at"] == RECORD["expires_at"]) == (expected == "expired")


def test_timestamps_come_from_the_run_and_task() -> None:
    status, times = batch_status(RECORD, RunState("success", at(0), at(10), "success", at(1), at(9)), now=NOW)
    assert status == "completed"
    assert (times["in_progress_at"], times["finalizing_at"], times["completed_at"]) == (
        int(at(1).timestamp()),
        int(at(9).timestamp()),
        int(at(10).timestamp()),
    )
    assert times["failed_at"] is None and times["cancelled_at"] is None
    _, cancelled = batch_status(
        {**RECORD, "cancelling_at": 123}, RunState("failed", at(0), at(10), "failed"), now=NOW
    )
    assert cancelled["cancelling_at"] == 123 and cancelled["cancelled_at"] == int(at(10).timestamp())


@pytest.mark.parametrize(
    ("record", "now", "expected", "ended_at_key"),
    [
        ({}, NOW, "failed", "failed_at"),
        ({"cancelling_at": 5}, NOW, "cancelled", "cancelled_at"),
        ({}, T0.timestamp() + 200, "expired", "expired_at"),
    ],
)
def test_a_failed_batch_task_ends_the_batch_before_the_scheduler_closes_its_run(
    record: dict, now: float, expected: str, ended_at_key: str
) -> None:
    """The batch task is the run's only task, and "failed" is final: a reader in the seconds before the
    scheduler marks the run failed saw "in_progress" (and could not delete the run yet)."""
    task_end = at(101) if expected == "expired" else at(9)
    run = RunState("running", at(0), None, "failed", at(1), task_end)
    status, times = batch_status({**RECORD, **record}, run, now=now)
    assert status == expected
    assert times[ended_at_key] is not None
    retrying = RunState("running", at(0), None, "up_for_retry", at(1), at(9))
    assert batch_status({**RECORD, **record}, retrying, now=NOW)[0] in ("in_progress", "cancelling")
