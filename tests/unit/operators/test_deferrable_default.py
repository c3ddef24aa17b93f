"""Tests of airflow_provider_raybatch/operators/llm_batch.py: ``deferrable`` defaults to Airflow's setting.

As in every first-class provider, the default is ``conf.getboolean("operators", "default_deferrable",
fallback=False)``, evaluated once, when the module is imported. A setting changed later in the same
process does not reach it, so the tests that set it read the default in a fresh interpreter, as the
DAG processor and the worker do when they parse a DAG file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from airflow.sdk import conf
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from tests.unit.operators.test_llm_batch import MANIFEST, REQUIRED, FakeCluster, FakeStateStore, FakeTI

SETTING_ENV = "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"
#: Builds the operator with and without ``deferrable`` and prints what each got, with the setting.
PROBE = f"""
import json
from airflow.sdk import conf
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

def deferrable(**kwargs):
    return RayLLMBatchOperator(task_id="t", user_template="{{Company}}", **{REQUIRED!r}, **kwargs).deferrable

print(json.dumps({{
    "setting": conf.getboolean("operators", "default_deferrable", fallback=False),
    "shipped": conf.get_default_value("operators", "default_deferrable"),
    "default": deferrable(),
    "explicit_true": deferrable(deferrable=True),
    "explicit_false": deferrable(deferrable=False),
}}))
"""


def _probe(setting: str | None, airflow_home: Path) -> dict[str, Any]:  # Any: JSON values.
    """What a fresh interpreter's operators get with ``[operators] default_deferrable`` so (None: unset)."""
    env = {name: value for name, value in os.environ.items() if name != SETTING_ENV}
    env["AIRFLOW_HOME"] = str(airflow_home)  # no airflow.cfg there: only the environment sets it
    if setting is not None:
        env[SETTING_ENV] = setting
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_default_is_the_setting() -> None:
    op = RayLLMBatchOperator(task_id="t", user_template="{Company}", **REQUIRED)

    assert op.deferrable is conf.getboolean("operators", "default_deferrable", fallback=False)


@pytest.mark.parametrize("setting", [None, "true", "false"])
def test_the_setting_decides_and_an_explicit_argument_wins(setting: str | None, tmp_path: Path) -> None:
    got = _probe(setting, tmp_path)

    if setting is None:  # never set: Airflow's shipped default, whatever that is
        assert got["setting"] is (got["shipped"].strip().lower() == "true")
    else:
        assert got["setting"] is (setting == "true")
    assert got["default"] is got["setting"]
    assert (got["explicit_true"], got["explicit_false"]) == (True, False)


def test_without_the_argument_the_task_waits_where_the_setting_says(
    ray_conn: str, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the worker, polling the job to its end, when the setting is False (Airflow's shipped
    default); deferred to the triggerer when it is True."""
    ti = FakeTI()
    job_id = cluster.add_try(ti, 1, "RUNNING", manifest=MANIFEST)
    metadata = cluster.jobs[0]["metadata"]
    cluster.jobs.clear()  # submitted by this try: nothing earlier is listed
    payloads = [cluster.job_payload(job_id, status, metadata=metadata) for status in ("RUNNING", "SUCCEEDED")]
    cluster.gets[job_id].mock(side_effect=[httpx.Response(200, json=payload) for payload in payloads])
    sleeps: list[float] = []
    monkeypatch.setattr(operator_module.time, "sleep", sleeps.append)
    op = RayLLMBatchOperator(
        task_id="classify",
        user_template="{Company}",
        progress_interval_seconds=0,
        ray_conn_id=ray_conn,
        **REQUIRED,
    )
    context = {"ti": ti, "task_state_store": FakeStateStore()}

    if conf.getboolean("operators", "default_deferrable", fallback=False):
        with pytest.raises(TaskDeferred):
            op.execute(context)
        assert not sleeps
    else:
        assert op.execute(context) == MANIFEST["output_uri"]
        assert sleeps, "the worker did not poll the job"
    assert [body["submission_id"] for body in cluster.submitted()] == [job_id]
