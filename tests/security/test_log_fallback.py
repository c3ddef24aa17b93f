"""The task's result from the driver log, where Airflow cannot read ``output_uri`` (issue 45 point 8).

The log is the job's, but other processes write into it (Ray forwards a replica's lines, a row's text
may be quoted in a warning). The result is taken only from a manifest line that names this job: the
run key and spec fingerprint an older committed manifest is matched by are public (the run key is
dag/task/run, the fingerprint is on the job's entrypoint in the dashboard).
"""

from __future__ import annotations

import json
import logging

import pytest

from airflow_provider_raybatch.jobs.committed_manifest import CommittedManifest
from airflow_provider_raybatch.operators import job_results
from airflow_provider_raybatch.shared.exceptions import RayJobFailedError
from airflow_provider_raybatch.shared.manifest import MANIFEST_LOG_MARKER
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

SPEC = BatchInferenceSpec.build(
    model="m",
    input_uri="/in.jsonl",
    output_uri="s3://unreachable/out",
    user_template="{text}",
    run_key="daily__scheduled__2026-12-01",
)
JOB = "raybatch-daily-t-scheduled__2026-12-01-m-1-t1-0123456789abcdef"


def _line(**changes: object) -> str:
    manifest = {
        "status": "complete",
        "job_id": JOB,
        "run_key": SPEC.run_key,
        "spec_fingerprint": SPEC.fingerprint(),
        "output_uri": SPEC.output_uri,
        "rows_in": 10,
        "rows_out": 10,
        "rows_failed": 0,
        "outputs_uri": f"{SPEC.output_uri}/versions/v1/outputs",
    }
    manifest.update(changes)
    return MANIFEST_LOG_MARKER + json.dumps(
        {key: value for key, value in manifest.items() if value is not ...}
    )


GENUINE = _line()
FORGED = {"rows_out": 0, "rows_failed": 10, "outputs_uri": "s3://attacker/x"}


class _Hook:
    def __init__(self, log: str) -> None:
        self.log = log

    def get_job_logs(self, job_id: str) -> str:
        return self.log


@pytest.fixture(autouse=True)
def _output_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        job_results,
        "read_committed_manifest",
        lambda uri, conn_id=None, within=None: CommittedManifest(None, f"{uri} is not reachable"),
    )


def _result(log: str) -> dict:
    return job_results.job_result(_Hook(log), JOB, SPEC, None, logging.getLogger("test"))


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(_line(job_id=None, **FORGED), id="job_id null"),
        pytest.param(_line(job_id=..., **FORGED), id="no job_id"),
        pytest.param(_line(job_id=JOB[:-4] + "ffff", **FORGED), id="another job's id"),
    ],
)
def test_a_manifest_line_that_does_not_name_this_job_is_never_its_result(forged: str) -> None:
    with pytest.raises(RayJobFailedError, match="not this job's result"):
        _result(forged)
    # Printed after the job's own, it does not hide it either.
    assert _result(f"{GENUINE}\n{forged}\n")["rows_out"] == 10


def test_the_jobs_own_manifest_line_is_its_result() -> None:
    assert _result(f"some line\n{GENUINE}\n")["outputs_uri"] == f"{SPEC.output_uri}/versions/v1/outputs"


def test_a_later_line_of_another_job_does_not_hide_a_held_run() -> None:
    """A job that held its run for its failed rows prints its manifest; the retry's thresholds judge it.
    A line after it that names another job (or none) is not this job's, and does not hide it."""
    held = _line(status="held", rows_out=4, rows_failed=6)
    for forged in (_line(job_id=JOB[:-4] + "ffff", status="held"), _line(job_id=None, status="held")):
        found = job_results.held_result_of(_Hook(f"{held}\n{forged}\n"), JOB, SPEC)
        assert found is not None and found["job_id"] == JOB and found["rows_out"] == 4
    assert job_results.held_result_of(_Hook(f"{forged}\n"), JOB, SPEC) is None
