"""Which day a scheduled run's templated input reads: a warning, as the DAG is parsed, for a daily
partition read on its own date.

On Airflow 3 a cron ``schedule`` (``"@daily"``, ``"0 0 * * *"``) is a ``CronTriggerTimetable`` unless
``[scheduler] create_cron_data_intervals`` is set: a run's logical date and its data interval are the
instant it runs. An ``input_uri`` of ``.../{{ ds }}/`` then reads the day that starts at midnight, not
the one that just ended, and the run finds an empty or partial folder: a green task with no rows, or
a part of them. Nothing fails, so it is said as the DAG is parsed (docs/howto-daily-run.md).
"""

from __future__ import annotations

import re

#: Context values that are the run's own instant under a cron trigger.
_RUN_DATES = re.compile(
    r"\b(ds|ds_nodash|ts|ts_nodash|logical_date|data_interval_start|data_interval_end|run_after)\b"
)
_DS_FILTER = re.compile(r"\|\s*ds(_nodash)?\b")
#: A template that moves the date (``macros.ds_add(ds, -1)``, ``.subtract(days=1)``, ``prev_ds``...).
_SHIFTED = re.compile(r"ds_add|timedelta|subtract|\.add\(|prev_|yesterday")


def todays_partition_warning(timetable: object, input_uri: object, schedule: object = None) -> str | None:
    """What to say when ``input_uri`` reads a run's own date under a cron trigger timetable; None when
    it does not, or may not (another timetable, no date in it, a date moved in the template).

    :param timetable: the DAG's ``timetable``.
    :param schedule: the DAG's ``schedule`` as its author wrote it (``"@daily"``), named in the
        message; unset or not text, the timetable's cron is.
    """
    if type(timetable).__name__ != "CronTriggerTimetable" or not isinstance(input_uri, str):
        return None
    # ``| ds`` formats a date; it is not the ``ds`` of the context.
    used = set(_RUN_DATES.findall(_DS_FILTER.sub("", input_uri))) if "{{" in input_uri else set()
    if not used or _SHIFTED.search(input_uri):
        return None
    # A trigger given an interval has its start that long before the run: a day, the day that ended.
    # (``interval`` on the Task SDK's class, which a DAG file builds; ``_interval`` on the scheduler's.)
    interval = getattr(timetable, "interval", None) or getattr(timetable, "_interval", None)
    if used <= {"data_interval_start"} and interval:
        return None
    written = _written_schedule(timetable, schedule)
    timezone = str(getattr(timetable, "timezone", None) or "UTC")
    dates = ", ".join(sorted(used))
    return (
        f"input_uri={input_uri!r} reads the run's own date ({dates}). Under schedule {written!r} (a cron "
        "trigger on Airflow 3: a run's logical date and data interval are the moment it runs) a run "
        "reads the period just starting, not the one that ended. To read the period that ended, "
        f"schedule with CronDataIntervalTimetable({written!r}, timezone={timezone!r}) and write "
        "{{ data_interval_start | ds }}, or move the date in the template ({{ macros.ds_add(ds, -1) }} "
        "for a day; docs/howto-daily-run.md, 'Read the day that ended')."
    )


def _written_schedule(timetable: object, schedule: object) -> str:
    """The schedule as the DAG's author wrote it. Airflow 3.3's timetable resolves a preset to its
    cron in place (``"@daily"`` becomes ``"0 0 * * *"``: the SDK's ``CronMixin``) and keeps no other
    copy, so a DAG that wrote ``"@daily"`` would be told of a cron it never wrote; the DAG's own
    ``schedule`` keeps the text. A timetable passed as ``schedule`` is named by its cron."""
    if isinstance(schedule, str) and schedule.strip():
        return schedule
    return str(getattr(timetable, "expression", None) or getattr(timetable, "summary", None) or "a cron")
