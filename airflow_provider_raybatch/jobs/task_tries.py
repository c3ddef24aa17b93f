"""Which Airflow try is running, and which try a Ray job was submitted by.

Both the operator's choice of an earlier job (attach, take its result, or stop it) and its
submission ids rest on these two small readings of Airflow's context and of a job's metadata;
kept here, pure and apart from the lifecycle that uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_raybatch.hooks.ray import JobInfo
from airflow_provider_raybatch.shared.job_ids import ATTEMPT_KEY, TRY_NUMBER_KEY, TaskTry

if TYPE_CHECKING:
    from airflow.sdk import Context


def task_try_of(context: Context) -> TaskTry:
    """The running task-instance try, with its DAG run's creation identity (``run_after``)."""
    ti = context["ti"]
    run_after = getattr(context.get("dag_run"), "run_after", None)
    return TaskTry(
        ti.dag_id,
        ti.run_id,
        ti.task_id,
        ti.map_index,
        ti.try_number,
        run_after.isoformat() if run_after is not None else "",
    )


def try_number_of(job: JobInfo) -> int:
    """The Airflow try number a job was submitted by (its metadata), or 0 when it names none."""
    value = job.metadata.get(TRY_NUMBER_KEY, "")
    return int(value) if value.isdigit() else 0


def submission_order(job: JobInfo) -> tuple[int, int, int]:
    """Sorts a run's jobs oldest to newest: by when Ray accepted them, then by try and attempt.

    The try number alone misorders a scheduled run deleted and created again (same ``run_after``):
    the new run's try 1 is submitted as a later attempt after the old run's try 2, and the newest
    job, the one a retry must attach to, is that attempt.
    """
    attempt = job.metadata.get(ATTEMPT_KEY, "")
    return (job.start_time_ms or 0, try_number_of(job), int(attempt) if attempt.isdigit() else 1)
