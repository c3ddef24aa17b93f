"""Two Airflow deployments (a dev and a prod `airflow standalone`, two Airflow homes) on one Ray head.

Issue 18 (a): a job identity that is this deployment's alone. Both deployments run the same DAG with
the same run id, as dev and prod do; each home's own generated ``[core] fernet_key`` is its secret
(no ``[raybatch] job_identity_secret`` is set, as in most deployments). Before, prod took dev's
running job for its own: it stopped it (their parameters differ) and then failed on the same
submission id; with equal parameters it would have adopted dev's result. A run deleted and created
again under the same run id took the deleted run's result. Issue 18 (c): once the driver log of a
succeeded job is gone, a clear still takes the committed result instead of failing.
"""

from __future__ import annotations

import configparser
import json
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    HELD_REPLICA,
    replica_slots_held,
    run_date,
    warm_conf,
)
from tests.integration.standalone import Airflow
from tests.integration.test_ticket_summary_dag import _write_tickets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

DAG_ID = "daily_support_ticket_summary"
TASK_ID = "summarise_tickets"
DAY = "2026-11-05"
#: Both deployments name the run alike, as two deployments of one DAG's schedule do.
RUN_ID = f"daily__{DAY}"
PROD_TICKETS = 6


@pytest.fixture
def deployments(second_airflow: Airflow, shared_airflow: Airflow) -> tuple[Airflow, Airflow]:
    """(dev, prod): the session's two deployments (tests/integration/deployments.py), each with its own
    home and fernet key and no ``[raybatch] job_identity_secret``."""
    return second_airflow, shared_airflow


def _fernet_key(home: Path) -> str:
    config = configparser.ConfigParser(interpolation=None)
    config.read(home / "airflow.cfg")
    return config.get("core", "fernet_key")


def _conf(tiny_model: Path, data_root: Path, replica_resources: dict = CPU_REPLICA) -> dict:
    return {
        "model": str(tiny_model),
        "data_root": str(data_root),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": replica_resources,
        **warm_conf(),
    }


def _held_conf(tiny_model: Path, data_root: Path) -> dict:
    """A run whose job waits, RUNNING, for a replica slot the test holds (HELD_REPLICA: no warm pool)."""
    conf = _conf(tiny_model, data_root, HELD_REPLICA)
    conf.pop("keep_warm_seconds", None)
    return conf


def _trigger(airflow: Airflow, conf: dict) -> str:
    """Create the day's run under RUN_ID (both deployments name it alike), unpaused."""
    airflow.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    body = {"dag_run_id": RUN_ID, "logical_date": f"{run_date(DAY)}T00:00:00Z", "conf": conf}
    return airflow.api("POST", f"/dags/{DAG_ID}/dagRuns", json=body).json()["dag_run_id"]


def _ti_path(run_id: str) -> str:
    return f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/{TASK_ID}"


def _xcom(airflow: Airflow, run_id: str, key: str) -> object:
    """The task's XCom, or None until it is pushed (or while the loaded API server does not answer)."""
    try:
        value = airflow.api("GET", f"{_ti_path(run_id)}/xcomEntries/{key}").json()["value"]
    except httpx.HTTPError:  # a 404 until pushed; two standalones and a job on 2 cores: slow answers
        return None
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def _job_of(airflow: Airflow, run_id: str, not_in: set[str] = frozenset()) -> str:
    """Wait until the run's task has pushed a job id other than ``not_in``; return it."""

    def pushed() -> str | None:
        job_id = _xcom(airflow, run_id, "job_id")
        return str(job_id) if job_id and job_id not in not_in else None

    return airflow.wait(f"a job id of {run_id} at {airflow.url}", pushed, every=2)


def _finished(airflow: Airflow, run_id: str, expected_try: int, timeout: float = 900) -> None:
    """Wait until the run's task ends; assert it succeeded on ``expected_try``, else say why it did not."""
    done = airflow.wait(
        f"{run_id} at {airflow.url} to finish",
        lambda: (
            ti
            if (ti := airflow.task_instance(DAG_ID, run_id, TASK_ID))["state"] in ("success", "failed")
            else None
        ),
        timeout=timeout,
    )
    assert (done["state"], done["try_number"]) == ("success", expected_try), airflow.why(
        DAG_ID, run_id, TASK_ID, done["try_number"]
    )


def _summarised(manifest: dict) -> list[str]:
    files = sorted(Path(manifest["outputs_uri"]).glob("*.jsonl"))
    return sorted(json.loads(line)["ticket_id"] for file in files for line in file.read_text().splitlines())


def test_two_deployments_share_a_ray_head_without_adopting_or_stopping_each_others_jobs(
    deployments: tuple[Airflow, Airflow], ray_cluster, tiny_model, tmp_path, monkeypatch
) -> None:
    dev, prod = deployments
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    hook = RayHook()
    # two deployments' secrets
    assert _fernet_key(dev.home) and _fernet_key(dev.home) != _fernet_key(prod.home)

    # Dev runs the day on its own data; its job runs, waiting for a replica slot the test holds, while
    # prod starts the same run: it can end only when stopped.
    _write_tickets(tmp_path / "dev" / "tickets" / DAY / "tickets.jsonl", PROD_TICKETS)
    with replica_slots_held(hook):
        run_id = _trigger(dev, _held_conf(tiny_model, tmp_path / "dev"))
        dev_job = _job_of(dev, run_id)
        assert not hook.get_job_status(dev_job).is_terminal

        _write_tickets(tmp_path / "prod" / "tickets" / DAY / "tickets.jsonl", PROD_TICKETS)
        assert _trigger(prod, _conf(tiny_model, tmp_path / "prod")) == run_id  # the same run id
        prod_job = _job_of(prod, run_id)

        assert prod_job != dev_job
        _finished(prod, run_id, expected_try=1)
        assert not hook.get_job_status(dev_job).is_terminal, "prod stopped dev's job"
        same_names = [job for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == run_id]
        assert {job.job_id for job in same_names} == {dev_job, prod_job}
        # Dev gives its run up the way its users would (mark failed): its job stops.
        dev.api("PATCH", _ti_path(run_id), json={"new_state": "failed"})
        dev.wait(
            "dev's job to stop",
            lambda: True if hook.get_job_status(dev_job).is_terminal else None,
            timeout=180,
        )

    assert hook.get_job_status(dev_job) == JobStatus.STOPPED
    manifest = _xcom(prod, run_id, "manifest")
    assert manifest["job_id"] == prod_job
    assert _summarised(manifest) == [f"T-{i:03d}" for i in range(PROD_TICKETS)]

    # Prod deletes the run and creates it again under the same run id: its jobs are new ones, not
    # the deleted run's result (same names, same parameters).
    # The task ends before the scheduler ends its run, and a running run cannot be deleted (409). Nor
    # may it go before the scheduler has taken both exits of its task's processes (the deferring one,
    # the resumed one) from its executor: the run created again has the same task instance key, and a
    # late exit of the deleted run's task took the new try's place in the executor, which the scheduler
    # then failed as "killed externally" before its trigger ever ran. A user deleting
    # from the UI is never that quick; an API client can be (Airflow's race, not ours).
    prod.wait(
        "prod's run to end and the scheduler to take its task's two exits",
        lambda: (
            True
            if prod.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}").json()["state"]
            in ("success", "failed")
            and prod.exits_taken(DAG_ID, run_id, try_number=1) >= 2
            else None
        ),
        timeout=120,
    )
    prod.api("DELETE", f"/dags/{DAG_ID}/dagRuns/{quote(run_id)}")
    assert _trigger(prod, _conf(tiny_model, tmp_path / "prod")) == run_id
    again_job = _job_of(prod, run_id)
    assert again_job not in (dev_job, prod_job)
    _finished(prod, run_id, expected_try=1)
    again = _xcom(prod, run_id, "manifest")
    assert again["job_id"] == again_job and again["version"] != manifest["version"]

    # (c) The driver log of the succeeded job is lost (a head restart, its node scaled away): a clear
    # takes the committed version, through a job of its own that checks on the cluster that nothing it
    # was made from changed, generates nothing, and prints the result in its own log.
    logs = list(ray_cluster.temp_dir.glob(f"session_*/logs/job-driver-{again_job}.*"))
    assert logs, "the driver log of the job was not where Ray keeps it"
    for path in logs:
        path.unlink(missing_ok=True)  # session_latest is a link to the session: each file twice
    assert "RAYBATCH_MANIFEST_JSON=" not in hook.get_job_logs(again_job)
    prod.clear(DAG_ID, run_id, TASK_ID)
    prod.wait(
        "the clear to start try 2",
        lambda: True if prod.task_instance(DAG_ID, run_id, TASK_ID)["try_number"] == 2 else None,
        every=1,
    )
    _finished(prod, run_id, expected_try=2, timeout=300)
    taken = _xcom(prod, run_id, "manifest")
    assert (taken["version"], taken["reused_result"]["job_id"]) == (again["version"], again_job)
    assert (taken["rows_out"], taken["outputs_uri"]) == (again["rows_out"], again["outputs_uri"])
    jobs = {
        job.job_id: job.status for job in hook.list_jobs() if job.metadata.get("airflow_run_id") == run_id
    }
    assert jobs == {
        dev_job: JobStatus.STOPPED,
        prod_job: JobStatus.SUCCEEDED,
        again_job: JobStatus.SUCCEEDED,
        taken["job_id"]: JobStatus.SUCCEEDED,
    }
