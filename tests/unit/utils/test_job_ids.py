"""Tests of airflow_provider_raybatch/utils/job_ids.py: deterministic submission ids and metadata."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from airflow_provider_raybatch.utils.job_ids import SUBMISSION_ID_PREFIX, TaskTry

TRY = TaskTry(
    dag_id="daily_company_industry",
    run_id="scheduled__2026-11-21T00:00:00+00:00",
    task_id="classify",
    map_index=-1,
    try_number=1,
)
SAFE = re.compile(r"[A-Za-z0-9_.-]+")


def test_submission_id_is_deterministic() -> None:
    same = TaskTry(TRY.dag_id, TRY.run_id, TRY.task_id, TRY.map_index, TRY.try_number)

    assert TRY.submission_id() == same.submission_id()


def test_submission_id_is_readable() -> None:
    submission_id = TRY.submission_id()

    assert submission_id.startswith(f"{SUBMISSION_ID_PREFIX}-daily_company_industry-classify-scheduled__2026")
    assert "-m-1-t1-" in submission_id


@pytest.mark.parametrize(
    "change",
    [
        {"try_number": 2},
        {"map_index": 0},
        {"map_index": 1},
        {"run_id": "scheduled__2026-11-22T00:00:00+00:00"},
        {"run_id": "manual__2026-11-21T00:00:00+00:00"},
        {"task_id": "classify_2"},
        {"dag_id": "other_dag"},
    ],
)
def test_submission_id_differs_per_try_map_index_and_run(change: dict) -> None:
    assert replace(TRY, **change).submission_id() != TRY.submission_id()


def test_names_that_clean_alike_still_differ() -> None:
    first = replace(TRY, dag_id="a b", run_id="r:1")
    second = replace(TRY, dag_id="a/b", run_id="r 1")

    assert first.submission_id() != second.submission_id()


@pytest.mark.parametrize(
    "task_try",
    [
        TRY,
        replace(TRY, dag_id="dág / ünïcode", task_id="group.task id", run_id="manual__2026:x?y#z&w%"),
        replace(TRY, dag_id="///", task_id="***", run_id="???"),
        replace(TRY, dag_id="d" * 300, task_id="t" * 300, run_id="r" * 300, map_index=12345, try_number=99),
    ],
)
def test_submission_id_uses_only_safe_characters(task_try: TaskTry) -> None:
    submission_id = task_try.submission_id()

    assert SAFE.fullmatch(submission_id), submission_id
    assert len(submission_id) <= 200


def test_metadata_values_are_strings() -> None:
    metadata = replace(TRY, map_index=3, try_number=2).metadata()

    assert metadata == {
        "airflow_dag_id": TRY.dag_id,
        "airflow_run_id": TRY.run_id,
        "airflow_task_id": TRY.task_id,
        "airflow_map_index": "3",
        "airflow_try_number": "2",
    }
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in metadata.items())
