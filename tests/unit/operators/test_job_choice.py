"""A try's start from the run's newest Ray job: attach, submit, or stop and submit."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus
from airflow_provider_raybatch.jobs.job_shipping import FINGERPRINT_KEY
from airflow_provider_raybatch.operators.job_choice import Start, choose_start

THIS_SPEC = "f" * 16


def job(status: JobStatus, fingerprint: str = THIS_SPEC) -> JobInfo:
    return JobInfo(job_id="raybatch-run-try1", status=status, metadata={FINGERPRINT_KEY: fingerprint})


def test_no_earlier_job_submits() -> None:
    choice = choose_start(None, THIS_SPEC)
    assert (choice.start, choice.previous, choice.previous_ended) == (Start.SUBMIT, None, False)


@pytest.mark.parametrize("status", [JobStatus.PENDING, JobStatus.RUNNING])
def test_a_live_job_of_the_same_parameters_is_attached_to(status: JobStatus) -> None:
    earlier = job(status)
    choice = choose_start(earlier, THIS_SPEC)
    assert (choice.start, choice.previous, choice.previous_ended) == (Start.ATTACH, earlier, False)


@pytest.mark.parametrize("status", [JobStatus.PENDING, JobStatus.RUNNING])
def test_a_live_job_of_other_parameters_is_stopped_and_a_new_one_submitted(status: JobStatus) -> None:
    earlier = job(status, fingerprint="0" * 16)
    choice = choose_start(earlier, THIS_SPEC)
    assert (choice.start, choice.previous) == (Start.STOP_AND_SUBMIT, earlier)


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED])
def test_after_an_ended_job_a_new_one_follows_it(status: JobStatus) -> None:
    """It resumes the ended job's staged rows or takes its committed version, on the cluster."""
    earlier = job(status)
    choice = choose_start(earlier, THIS_SPEC)
    assert (choice.start, choice.previous, choice.previous_ended) == (Start.SUBMIT, earlier, True)


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED])
def test_an_ended_job_of_other_parameters_counts_for_nothing(status: JobStatus) -> None:
    choice = choose_start(job(status, fingerprint="0" * 16), THIS_SPEC)
    assert (choice.start, choice.previous, choice.previous_ended) == (Start.SUBMIT, None, False)


def test_a_job_without_a_fingerprint_is_of_other_parameters() -> None:
    earlier = JobInfo(job_id="raybatch-run-try1", status=JobStatus.RUNNING)
    assert choose_start(earlier, THIS_SPEC).start is Start.STOP_AND_SUBMIT
