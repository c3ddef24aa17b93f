"""Tests of pipeline/generate/staged_udf.py: when an engine took a stage's first row (start-up's end)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from airflow_provider_raybatch.pipeline.generate.staged_udf import TIME_IN_ENGINE, StagesFinishedRows


def stage() -> StagesFinishedRows:
    """The mixin alone, with a writer that only holds the stamp (the rest needs a stage UDF and Ray)."""
    udf = StagesFinishedRows()
    udf._writer = SimpleNamespace(first_row_in_engine_at=None)  # type: ignore[assignment]
    return udf


def test_the_stamp_is_the_earliest_row_finish_less_its_time_in_the_engine() -> None:
    udf = stage()
    before = time.time()
    udf._note_engine_start({TIME_IN_ENGINE: 3.0})
    udf._note_engine_start({TIME_IN_ENGINE: 10.0})  # in the engine longer: it started earlier
    udf._note_engine_start({TIME_IN_ENGINE: 0.5})

    assert before - 10.0 <= udf._writer.first_row_in_engine_at <= time.time() - 10.0


@pytest.mark.parametrize("seconds", [-1, None, "3", True, float("nan")])
def test_a_row_that_never_reached_the_engine_stamps_nothing(seconds: object) -> None:
    """Ray Data LLM says -1 for a row that failed before the engine; other values are not times."""
    udf = stage()
    udf._note_engine_start({TIME_IN_ENGINE: seconds})
    udf._note_engine_start({})

    assert udf._writer.first_row_in_engine_at is None
