"""Tests of airflow_provider_raybatch/shared/job_settings.py: one rule for the job's whole-number
settings, checked the same way before submitting (check_env_vars) and as the job starts (whole_number)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline import worker_warmup
from airflow_provider_raybatch.pipeline.generate import engine
from airflow_provider_raybatch.pipeline.read import dedupe, prepared_cache
from airflow_provider_raybatch.shared import job_settings


def test_the_table_is_what_the_modules_read() -> None:
    assert job_settings.MAXIMA == {
        worker_warmup.WARM_WORKERS_ENV: worker_warmup.WARM_WORKERS_LIMIT,
        dedupe.DRIVER_SCAN_MAX_ROWS_ENV: dedupe.DRIVER_SCAN_MAX_ROWS_LIMIT,
        prepared_cache.KEEP_MIN_ROWS_ENV: 10**12,
        engine.ENGINE_MAX_RESTARTS_ENV: engine.ENGINE_MAX_RESTARTS_LIMIT,
    }


#: Text an environment can hold (no NUL, no lone surrogate), numbers in and out of range, near misses.
_VALUES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=16),
    st.integers(-5, 10**13).map(str),
    st.sampled_from([" 4 ", "4.0", "+4", "\u0664", "0x10", "1e3", "", " "]),
)


@given(name=st.sampled_from(sorted(job_settings.MAXIMA)), value=_VALUES)
def test_before_submitting_a_value_is_refused_exactly_when_the_job_would_refuse_it(
    name: str, value: str
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(name, value)
        try:
            job_settings.whole_number(name, 7, job_settings.MAXIMA[name])
        except ValueError:
            job_refuses = True
        else:
            job_refuses = False

    if job_refuses:
        with pytest.raises(ValueError, match=name):
            job_settings.check_env_vars({name: value})
    else:
        job_settings.check_env_vars({name: value})


def test_a_value_that_is_not_text_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="RAYBATCH_WARM_WORKERS=4: give it as text"):
        job_settings.check_env_vars({"RAYBATCH_WARM_WORKERS": 4})


def test_other_env_vars_are_not_looked_at() -> None:
    job_settings.check_env_vars({"HF_HOME": "/models", "RAYBATCH_SOMETHING_ELSE": "words"})


@pytest.mark.parametrize("value", ["\ud800", "4\x00", "\u0664"])
def test_text_no_environment_would_take_is_refused_before_submitting(value: str) -> None:
    with pytest.raises(ValueError, match="RAYBATCH_WARM_WORKERS="):
        job_settings.check_env_vars({"RAYBATCH_WARM_WORKERS": value})
