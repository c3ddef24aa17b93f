"""Issue 18 on the operator: a job identity of our own (a), every end of a deferred wait stops the job
(b), and the result read from the committed manifest (c). Against a fake Ray Jobs API (respx)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferralError, TaskDeferralTimeout, TaskDeferred

from airflow_provider_raybatch.jobs.deployment_secret import signing_key
from airflow_provider_raybatch.jobs.job_shipping import FINGERPRINT_KEY
from airflow_provider_raybatch.operators.llm_batch import JOB_ID_STATE_KEY
from airflow_provider_raybatch.shared.exceptions import (
    RayBatchConfigError,
    RayJobAlreadyExistsError,
    RayJobFailedError,
)
from airflow_provider_raybatch.shared.job_ids import REUSE_COMMITTED_KEY
from airflow_provider_raybatch.shared.manifest import manifest_log_line
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.operators.test_llm_batch import (
    FINGERPRINT,
    KEY,
    MANIFEST,
    FakeCluster,
    FakeStateStore,
    FakeTI,
    make_operator,
    retry_ti,
    task_try_of,
)

#: The other deployment (dev, where this one is prod) on the same Ray cluster.
OTHER_KEY = signing_key("the-dev-deployments-secret")


class XComTI(FakeTI):
    """A task instance that also reads back this try's XComs, as a resumed task does."""

    def xcom_pull(self, task_ids: str, key: str, map_indexes: int) -> Any:  # Any: XCom values.
        assert (task_ids, map_indexes) == (self.task_id, self.map_index)
        return self.xcoms.get(key)


# -- (a) a job identity only this deployment can make -----------------------------------------------


@pytest.mark.parametrize("status", ["RUNNING", "SUCCEEDED", "FAILED"])
@pytest.mark.parametrize("fingerprint", [FINGERPRINT, "another-spec"])
def test_another_deployments_job_of_the_same_run_is_neither_adopted_nor_stopped(
    ray_conn: str, cluster: FakeCluster, status: str, fingerprint: str
) -> None:
    """Dev and prod run the same DAG on one cluster: prod neither stops dev's job (parameters differ)
    nor takes its result (they match), and its own submission id does not collide with dev's."""
    ti = FakeTI()
    devs = task_try_of(ti)
    devs_id = devs.submission_id(OTHER_KEY)
    cluster.add_job(
        devs_id, status, {**devs.metadata(), FINGERPRINT_KEY: fingerprint}, logs=manifest_log_line(MANIFEST)
    )

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    [body] = cluster.submitted()
    assert body["submission_id"] == task_try_of(ti).submission_id(KEY) != devs_id
    assert info.value.trigger.job_id == body["submission_id"]
    assert not cluster.stops[devs_id].called


@pytest.mark.parametrize("status", ["RUNNING", "SUCCEEDED"])
def test_a_job_with_copied_metadata_is_neither_adopted_nor_stopped(
    ray_conn: str, cluster: FakeCluster, status: str
) -> None:
    """Any cluster user can submit a job with our metadata copied from `ray job list`."""
    ti = retry_ti(2)
    ours = cluster.add_try(ti, 1, "FAILED")
    forged = (
        "raybatch-daily_company_industry-classify-manual__2026-11-21T00_00_00_00_00-m-1-t1-0123456789abcdef"
    )
    copied = {**next(job for job in cluster.jobs if job["submission_id"] == ours)["metadata"]}
    cluster.add_job(forged, status, {**copied, "airflow_try_number": "2"}, logs=manifest_log_line(MANIFEST))

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]
    assert not cluster.stops[forged].called


def test_a_recorded_job_that_is_not_ours_is_left_alone(ray_conn: str, cluster: FakeCluster) -> None:
    """The task state store names a job this deployment cannot prove its own: neither stopped nor taken."""
    ti = retry_ti(2)
    cluster.add_job("someone-elses-job", "RUNNING", task_try_of(ti, 1).metadata())
    store = FakeStateStore(**{JOB_ID_STATE_KEY: "someone-elses-job"})

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "task_state_store": store})

    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti).submission_id(KEY)]
    assert not cluster.stops["someone-elses-job"].called


def test_a_run_deleted_and_created_again_gets_new_jobs(ray_conn: str, cluster: FakeCluster) -> None:
    """The same run id again: the deleted run's job (same names, same parameters) is not this run's,
    and the new run's submission id does not collide with it (which failed every try before)."""
    first_run = SimpleNamespace(run_after=datetime(2026, 11, 21, 6, 0, tzinfo=UTC))
    again = SimpleNamespace(run_after=datetime(2026, 11, 25, 9, 30, 1, 123456, tzinfo=UTC))
    ti = FakeTI()
    deleted_runs = replace(task_try_of(ti), run_after=first_run.run_after.isoformat())
    deleted_id = deleted_runs.submission_id(KEY)
    cluster.add_job(
        deleted_id,
        "SUCCEEDED",
        {**deleted_runs.metadata(), FINGERPRINT_KEY: FINGERPRINT},
        logs=manifest_log_line(MANIFEST),
    )

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn).execute(
            {"ti": ti, "dag_run": again, "task_state_store": FakeStateStore()}
        )

    [body] = cluster.submitted()
    assert body["submission_id"] != deleted_id
    assert body["metadata"]["airflow_run_after"] == again.run_after.isoformat()


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED"])
def test_a_scheduled_run_created_again_submits_under_the_next_free_id(
    ray_conn: str, cluster: FakeCluster, status: str
) -> None:
    """A scheduled run deleted and created again has the same run_after, so its try 1 would have the
    deleted run's try-1 id, which Ray refuses (AlreadyExists): every try would fail."""
    run = SimpleNamespace(run_after=datetime(2026, 3, 13, tzinfo=UTC))
    ti = FakeTI()
    deleted = replace(task_try_of(ti), run_after=run.run_after.isoformat())
    cluster.add_job(
        deleted.submission_id(KEY), status, {**deleted.metadata(), FINGERPRINT_KEY: "other-params"}
    )

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "dag_run": run})

    second = replace(deleted, attempt=2)
    assert [body["submission_id"] for body in cluster.submitted()] == [
        deleted.submission_id(KEY),
        second.submission_id(KEY),
    ]
    assert info.value.trigger.job_id == second.submission_id(KEY)
    assert cluster.submitted()[-1]["metadata"]["raybatch_submission_attempt"] == "2"
    assert deleted.owns(second.submission_id(KEY), second.metadata(), KEY)  # a later try still finds it


def test_when_every_id_of_a_try_is_taken_the_error_says_why(
    ray_conn: str, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("airflow_provider_raybatch.jobs.job_shipping.MAX_SUBMISSION_ATTEMPTS", 2)
    ti = FakeTI()
    for attempt in (1, 2):
        taken = replace(task_try_of(ti), attempt=attempt)
        cluster.add_job(taken.submission_id(KEY), "FAILED", {**taken.metadata(), FINGERPRINT_KEY: "other"})

    with pytest.raises(RayJobAlreadyExistsError, match=r"job_identity_secret.*own"):
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti})


def test_the_same_run_keeps_its_jobs_across_tries(ray_conn: str, cluster: FakeCluster) -> None:
    """The other side of the re-created run: a retry of the same run (same run_after) attaches."""
    run = SimpleNamespace(run_after=datetime(2026, 11, 21, 6, 0, tzinfo=UTC))
    ti = retry_ti(2)
    first = replace(task_try_of(ti, 1), run_after=run.run_after.isoformat())
    cluster.add_job(first.submission_id(KEY), "RUNNING", {**first.metadata(), FINGERPRINT_KEY: FINGERPRINT})

    with pytest.raises(TaskDeferred) as info:
        make_operator(ray_conn_id=ray_conn).execute({"ti": ti, "dag_run": run})

    assert info.value.trigger.job_id == first.submission_id(KEY)
    assert not cluster.submit.called


def test_no_deployment_secret_submits_nothing(
    ray_conn: str, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("RAYBATCH__JOB_IDENTITY_SECRET", "CORE__FERNET_KEY", "API_AUTH__JWT_SECRET"):
        monkeypatch.setenv(f"AIRFLOW__{variable}", "")

    with pytest.raises(RayBatchConfigError, match="job_identity_secret"):
        make_operator(ray_conn_id=ray_conn).execute({"ti": FakeTI()})

    assert not cluster.submit.called


# -- (b) every end of a deferred wait stops the job -------------------------------------------------


@pytest.mark.parametrize("reason", ["api_error", "trigger_error", "timeout"])
def test_an_error_event_stops_a_job_still_running(ray_conn: str, cluster: FakeCluster, reason: str) -> None:
    """The Jobs API was unreachable for the retry window, or the trigger crashed: the job may still
    run. The worker path stops it whatever ends its wait; so does this one."""
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "RUNNING", logs="step 3 of 9\n")
    event = job_event("error", job, "the Jobs API did not answer for 300 s", reason)

    with pytest.raises(RayJobFailedError, match="did not answer"):
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, event)

    assert cluster.stops[job].call_count == 1


def test_an_error_event_for_a_job_that_ended_stops_nothing(ray_conn: str, cluster: FakeCluster) -> None:
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "FAILED")

    with pytest.raises(RayJobFailedError):
        make_operator(ray_conn_id=ray_conn).execute_complete(
            {"ti": ti}, job_event("error", job, "x", "failed")
        )

    assert not cluster.stops[job].called


@pytest.mark.parametrize(
    ("error", "raised"), [("Trigger timeout", TaskDeferralTimeout), ("Trigger failure", TaskDeferralError)]
)
def test_airflows_own_deferral_timeout_or_a_crashed_trigger_stops_the_job(
    ray_conn: str, cluster: FakeCluster, error: str, raised: type[Exception]
) -> None:
    """Airflow resumes the task only to fail it (``__fail__``), with no event: the operator is rebuilt
    without its job id, finds it in this try's XCom, stops it, and fails as Airflow does."""
    ti = XComTI()
    job = cluster.add_try(ti, 1, "RUNNING")
    ti.xcom_push(key="job_id", value=job)  # pushed before the deferral
    op = make_operator(ray_conn_id=ray_conn)

    with pytest.raises(raised):
        op.resume_execution("__fail__", {"error": error}, {"ti": ti})

    assert cluster.stops[job].call_count == 1
    assert op.job_id == job


def test_a_deferral_failure_finds_the_job_in_the_task_state_store(
    ray_conn: str, cluster: FakeCluster
) -> None:
    ti = XComTI()
    job = cluster.add_try(ti, 1, "RUNNING")

    with pytest.raises(TaskDeferralError):
        make_operator(ray_conn_id=ray_conn).resume_execution(
            "__fail__",
            {"error": "Trigger failure"},
            {"ti": ti, "task_state_store": FakeStateStore(**{JOB_ID_STATE_KEY: job})},
        )

    assert cluster.stops[job].call_count == 1


def test_a_deferral_failure_never_stops_a_job_that_is_not_ours(ray_conn: str, cluster: FakeCluster) -> None:
    """An XCom can be written through the API: it must not make the task stop someone else's job."""
    ti = XComTI()
    cluster.add_job("someone-elses-job", "RUNNING", task_try_of(ti).metadata())
    ti.xcom_push(key="job_id", value="someone-elses-job")

    with pytest.raises(TaskDeferralError):
        make_operator(ray_conn_id=ray_conn).resume_execution(
            "__fail__", {"error": "Trigger failure"}, {"ti": ti}
        )

    assert not cluster.stops["someone-elses-job"].called


def test_an_ordinary_resume_still_calls_execute_complete(ray_conn: str, cluster: FakeCluster) -> None:
    ti = XComTI()
    job = cluster.add_try(ti, 1, "SUCCEEDED", manifest=MANIFEST)
    event = job_event("success", job, "ok", "succeeded")

    result = make_operator(ray_conn_id=ray_conn).resume_execution(
        "execute_complete", {"event": event, "deadline": None, "attached_at": None}, {"ti": ti}
    )

    assert result == MANIFEST["output_uri"]
    assert not cluster.stops[job].called


# -- (c) the result is the committed manifest, the log only a fallback ------------------------------


def committed(output: Path, **fields: Any) -> dict[str, Any]:  # Any: JSON values.
    """Commit a manifest at ``output`` as the pipeline does; returns it."""
    manifest = {
        "status": "complete",
        "output_uri": str(output),
        "rows_in": 30,
        "rows_out": 29,
        "rows_failed": 1,
        "version": "v1",
        **fields,
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / "manifest.json").write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("log_answer", [{"logs": ""}, None])
def test_a_succeeded_job_whose_driver_log_is_gone_gives_its_committed_result(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path, log_answer: dict | None
) -> None:
    """A head restart (GCS fault tolerance) or a driver node scaled away loses the driver log: the
    job's result is its committed manifest, not a failure with "printed no run manifest"."""
    ti = FakeTI()
    op = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out"))
    job = cluster.add_try(ti, 1, "SUCCEEDED", fingerprint=op.build_spec().fingerprint())
    if log_answer is None:  # the logs call itself fails
        cluster.router.get(f"/api/jobs/{job}/logs").respond(500, text="log file not found")
    manifest = committed(tmp_path / "out", job_id=job)

    done = job_event("success", job, "ok", "succeeded")
    assert op.execute_complete({"ti": ti}, done) == str(tmp_path / "out")

    assert ti.xcoms["manifest"] == manifest


def test_the_committed_manifest_wins_over_the_log(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "SUCCEEDED", logs=manifest_log_line({**MANIFEST, "rows_out": 1}))
    manifest = committed(tmp_path / "out", job_id=job)

    make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out")).execute_complete(
        {"ti": ti}, job_event("success", job, "ok", "succeeded")
    )

    assert ti.xcoms["manifest"] == manifest


def test_another_jobs_committed_manifest_is_not_this_jobs_result(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    """A later job committed to the same place: this job's result is its own, from its log."""
    ti = FakeTI()
    from_log = {**MANIFEST, "output_uri": str(tmp_path / "out")}
    job = cluster.add_try(ti, 1, "SUCCEEDED", manifest=from_log)
    committed(tmp_path / "out", job_id="raybatch-a-later-job", rows_out=3)

    make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out")).execute_complete(
        {"ti": ti}, job_event("success", job, "ok", "succeeded")
    )

    assert ti.xcoms["manifest"] == {**from_log, "job_id": job}


@pytest.mark.parametrize("other_type", [{"version": 3}, {"wall_seconds": "fast"}])
def test_a_committed_manifest_with_a_value_of_another_type_is_still_this_jobs_result(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path, other_type: dict
) -> None:
    """A value the task does not decide by, of another type than this provider writes (a newer job's):
    the result is the committed manifest, handed on as written, not a failure for want of one."""
    ti = FakeTI()
    op = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out"))
    job = cluster.add_try(ti, 1, "SUCCEEDED", fingerprint=op.build_spec().fingerprint())
    manifest = committed(tmp_path / "out", job_id=job, **other_type)

    assert op.execute_complete({"ti": ti}, job_event("success", job, "ok", "succeeded")) == str(
        tmp_path / "out"
    )

    assert ti.xcoms["manifest"] == manifest


def test_a_committed_manifest_whose_counts_are_not_numbers_is_not_taken(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    """Its counts decide the failed-row verdict: the result is the driver log's."""
    ti = FakeTI()
    from_log = {**MANIFEST, "output_uri": str(tmp_path / "out")}
    job = cluster.add_try(ti, 1, "SUCCEEDED", manifest=from_log)
    committed(tmp_path / "out", job_id=job, rows_failed="one")

    make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out")).execute_complete(
        {"ti": ti}, job_event("success", job, "ok", "succeeded")
    )

    assert ti.xcoms["manifest"] == {**from_log, "job_id": job}


def test_a_manifest_from_before_job_ids_counts_when_run_and_spec_match(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "SUCCEEDED")  # its log is empty
    op = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out"))
    spec = op.build_spec(run_key=task_try_of(ti).run_key())
    manifest = committed(tmp_path / "out", run_key=spec.run_key, spec_fingerprint=spec.fingerprint())

    op.execute_complete({"ti": ti}, job_event("success", job, "ok", "succeeded"))

    assert ti.xcoms["manifest"] == manifest


def test_an_old_manifest_of_another_spec_is_not_taken(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "SUCCEEDED")  # its log is empty
    op = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out"))
    committed(tmp_path / "out", run_key=task_try_of(ti).run_key(), spec_fingerprint="an-older-prompt")

    with pytest.raises(RayJobFailedError, match="result cannot be found"):
        op.execute_complete({"ti": ti}, job_event("success", job, "ok", "succeeded"))


@pytest.mark.parametrize("status", ["STOPPED", "FAILED"])
def test_a_retry_after_a_job_that_ended_badly_after_it_committed_may_take_its_version(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path, status: str
) -> None:
    """`ray job stop` landing 120 ms after the job committed: the retry's job is told it may take the
    committed version (pipeline/stage/reuse.py takes it when made from the same input, code and model),
    rather than generating all rows again."""
    ti = retry_ti(2)
    op = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out"))
    job = cluster.add_try(ti, 1, status, fingerprint=op.build_spec().fingerprint())
    committed(tmp_path / "out", job_id=job)

    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti, "task_state_store": FakeStateStore()})

    [body] = cluster.submitted()
    assert body["submission_id"] != job and body["metadata"][REUSE_COMMITTED_KEY] == "true"


@pytest.mark.parametrize(("status", "reason"), [("cancelled", "stopped"), ("error", "failed")])
def test_a_wait_ending_badly_after_the_commit_is_a_success(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path, status: str, reason: str
) -> None:
    ti = FakeTI()
    job = cluster.add_try(ti, 1, "STOPPED" if status == "cancelled" else "FAILED")
    manifest = committed(tmp_path / "out", job_id=job)

    result = make_operator(ray_conn_id=ray_conn, output_uri=str(tmp_path / "out")).execute_complete(
        {"ti": ti}, job_event(status, job, f"Ray job {job} finished.", reason)
    )

    assert result == str(tmp_path / "out") and ti.xcoms["manifest"] == manifest
    assert not cluster.stops[job].called


def test_a_result_whose_version_another_commit_deleted_fails_naming_both(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    """Two runs write one output_uri: the later commit may delete the earlier run's version, so a clear
    of the earlier run must not "succeed" with a manifest pointing at nothing."""
    ti = FakeTI()
    out = tmp_path / "out"
    mine = {
        **MANIFEST,
        "output_uri": str(out),
        "version": "v1",
        "outputs_uri": str(out / "versions/v1/outputs"),
    }
    job = cluster.add_try(ti, 1, "SUCCEEDED", manifest=mine)
    committed(out, job_id="raybatch-another-run", version="v2")  # v1's folder is gone

    with pytest.raises(RayJobFailedError, match=r"replaced it.*keep_versions=True") as info:
        make_operator(ray_conn_id=ray_conn, output_uri=str(out)).execute_complete(
            {"ti": ti}, job_event("success", job, "ok", "succeeded")
        )

    assert "raybatch-another-run" in str(info.value) and "v2" in str(info.value)
    assert "manifest" not in ti.xcoms


def test_a_kept_version_under_a_later_commit_is_still_this_jobs_result(
    ray_conn: str, cluster: FakeCluster, tmp_path: Path
) -> None:
    ti = FakeTI()
    out = tmp_path / "out"
    mine = {
        **MANIFEST,
        "output_uri": str(out),
        "version": "v1",
        "outputs_uri": str(out / "versions/v1/outputs"),
    }
    (out / "versions/v1/outputs").mkdir(parents=True)  # keep_versions=True kept it
    job = cluster.add_try(ti, 1, "SUCCEEDED", manifest=mine)
    committed(out, job_id="raybatch-another-run", version="v2")

    make_operator(ray_conn_id=ray_conn, output_uri=str(out)).execute_complete(
        {"ti": ti}, job_event("success", job, "ok", "succeeded")
    )

    assert ti.xcoms["manifest"] == {**mine, "job_id": job}
