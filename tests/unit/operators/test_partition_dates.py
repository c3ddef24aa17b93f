"""The warning, as a DAG is parsed, for a daily partition read on the run's own date under a cron
trigger (operators/partition_dates.py); real DAGs with Airflow's own timetables."""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, CronDataIntervalTimetable, CronTriggerTimetable

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

TODAY = "s3://b/tickets/{{ ds }}/"


def _warnings(schedule: object, input_uri: str) -> list[str]:
    """What building a batch task of a DAG on ``schedule`` warns."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DAG("daily", schedule=schedule, start_date=datetime(2026, 1, 1), catchup=False):
            RayLLMBatchOperator(
                task_id="summarise",
                model="m",
                input_uri=input_uri,
                output_uri="s3://b/out/{{ ds }}",
                user_template="{text}",
                input_format="jsonl",
            )
    return [str(warning.message) for warning in caught if "reads the run's own date" in str(warning.message)]


@pytest.mark.parametrize(
    "schedule", ["@daily", "0 0 * * *", CronTriggerTimetable("0 0 * * *", timezone="UTC")]
)
def test_a_cron_trigger_reading_its_own_date_is_warned_about_naming_the_task_and_the_way_out(
    schedule: object,
) -> None:
    [message] = _warnings(schedule, TODAY)
    assert message.startswith(
        "RayLLMBatchOperator (task_id: summarise): input_uri='s3://b/tickets/{{ ds }}/'"
    )
    assert "reads the period just starting, not the one that ended" in message
    written = schedule if isinstance(schedule, str) else "0 0 * * *"
    assert f"CronDataIntervalTimetable({written!r}, timezone='UTC')" in message
    assert "macros.ds_add(ds, -1)" in message


def test_the_way_out_keeps_the_dags_own_cron() -> None:
    """A weekly run at 06:00 is told to keep its cron in a data-interval timetable, not to run daily."""
    [message] = _warnings("0 6 * * 1", TODAY)
    assert "schedule with CronDataIntervalTimetable('0 6 * * 1', timezone='UTC')" in message


@pytest.mark.parametrize(
    ("schedule", "input_uri"),
    [
        # the examples' way: a data-interval timetable, the interval's start
        (CronDataIntervalTimetable("0 0 * * *", timezone="UTC"), "s3://b/{{ data_interval_start | ds }}/"),
        (CronDataIntervalTimetable("0 0 * * *", timezone="UTC"), TODAY),
        # the date moved in the template
        ("@daily", "s3://b/{{ macros.ds_add(ds, -1) }}/"),
        ("@daily", "s3://b/{{ data_interval_start.subtract(days=1) | ds }}/"),
        # a trigger whose interval is a day: its start is the day that ended
        (
            CronTriggerTimetable("0 0 * * *", timezone="UTC", interval=timedelta(days=1)),
            "s3://b/{{ data_interval_start | ds }}/",
        ),
        # no date in it, or no schedule
        ("@daily", "s3://b/tickets/{{ params.day }}/"),
        ("@daily", "s3://b/tickets/latest/"),
        (None, TODAY),
    ],
)
def test_no_warning_where_the_day_read_is_not_the_runs_own(schedule: object, input_uri: str) -> None:
    assert _warnings(schedule, input_uri) == []


@pytest.mark.parametrize("schedule", ["@daily", "@monthly", "0 0 * * *"])
def test_the_warning_names_the_schedule_as_the_dag_wrote_it(schedule: str) -> None:
    """Airflow 3.3's timetable turns "@daily" into its cron; the message keeps the DAG's own words, in
    what it says and in the timetable it offers."""
    [message] = _warnings(schedule, TODAY)
    assert f"Under schedule {schedule!r} (a cron trigger" in message
    assert f"schedule with CronDataIntervalTimetable({schedule!r}, timezone='UTC')" in message


# -- the month a monthly DAG reads (docs/howto-daily-run.md, 'Read the day that ended') -------------


def _scheduler_dag(schedule: object) -> Any:  # Any: Airflow's SerializedDAG, as the scheduler has it.
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("monthly", schedule=schedule, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        pass
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def _utc(*day: int) -> pendulum.DateTime:
    return pendulum.datetime(*day, tz="UTC")


def _scheduled_at(dag: Any, run_after: pendulum.DateTime) -> Any:  # Any: Airflow's DataInterval.
    """The data interval of the scheduled run made at ``run_after``, the run before it made."""
    from airflow.timetables.base import DataInterval, TimeRestriction

    before = dag.timetable.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=run_after.subtract(months=2), latest=None, catchup=True),
    )
    info = before
    while info.run_after < run_after:
        info = dag.timetable.next_dagrun_info(
            last_automated_data_interval=DataInterval(*info.data_interval),
            restriction=TimeRestriction(earliest=_utc(2026, 1, 1), latest=None, catchup=True),
        )
    assert info.run_after == run_after
    return info.data_interval


def test_a_monthly_cron_trigger_reads_the_month_just_starting() -> None:
    """schedule="@monthly": the run made at midnight of 2026-12-01 has the interval 12-01 to 12-01,
    so its {{ ds }} and {{ data_interval_start }} are the first day of December, not November."""
    dag = _scheduler_dag("@monthly")
    assert type(dag.timetable).__name__ == "CronTriggerTimetable"
    assert _scheduled_at(dag, _utc(2026, 12, 1)) == (_utc(2026, 12, 1), _utc(2026, 12, 1))


def test_a_monthly_data_interval_timetable_reads_the_month_that_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CronDataIntervalTimetable("0 0 1 * *"): the run at midnight of 2026-12-01 covers November; a
    manual run covers the last month ended by its date; a backfill makes one run per month whose
    first day lies in the range, and none for a month not ended yet."""
    from airflow.models import backfill

    dag = _scheduler_dag(CronDataIntervalTimetable("0 0 1 * *", timezone="UTC"))

    assert _scheduled_at(dag, _utc(2026, 12, 1)) == (_utc(2026, 11, 1), _utc(2026, 12, 1))
    for manual in (_utc(2026, 12, 1), _utc(2026, 12, 15)):
        assert dag.timetable.infer_manual_data_interval(run_after=manual) == (
            _utc(2026, 11, 1),
            _utc(2026, 12, 1),
        )

    monkeypatch.setattr(backfill.timezone, "utcnow", lambda: _utc(2026, 12, 15))

    def backfilled(from_date: pendulum.DateTime, to_date: pendulum.DateTime) -> list[str]:
        """The months ``airflow backfill create --from-date --to-date`` runs (Airflow's own list)."""
        infos = backfill._get_info_list(from_date=from_date, to_date=to_date, reverse=False, dag=dag)
        return [info.data_interval.start.format("YYYY-MM") for info in infos]

    assert backfilled(_utc(2026, 1, 1), _utc(2026, 3, 31)) == ["2026-01", "2026-02", "2026-03"]
    assert backfilled(_utc(2026, 1, 15), _utc(2026, 3, 15)) == ["2026-02", "2026-03"]
    assert backfilled(_utc(2026, 11, 1), _utc(2026, 12, 31)) == ["2026-11"]  # December has not ended
