"""Which Airflow try is running, and which try a Ray job was submitted by.

Both the operator's choice of an earlier job (attach, take its result, or stop it) and its
submission ids rest on these two small readings of Airflow's context and of a job's metadata;
kept here, pure and apart from the lifecycle that uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_raybatch.hooks.ray import JobInfo
from airflow_provider_raybatch.utils.job_ids import TaskTry

if TYPE_CHECKING:
    from airflow.sdk import Context


def task_try_of(context: Context) -> TaskTry:
    """The running task-instance try, with its DAG run's creation identity (``run_after``)."""
    ti = context["ti"]
    run_after = getattr(context.get("dag_run"), "run_after", None)
    return TaskTry(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number,
                   run_after.isoformat() if run_after is not None else "")  # fmt: skip


def try_number_of(job: JobInfo) -> int:
    """The Airflow try number a job was submitted by (its metadata), or 0 when it names none."""
    value = job.metadata.get("airflow_try_number", "")
    return int(value) if value.isdigit() else 0
