"""Tests of airflow_provider_raybatch/operators/llm_batch.py: a run with too many failed rows fails its task.

The job succeeded and committed outputs and errors either way; the operator pushes the XComs, then
judges the manifest with its own ``max_failed_fraction`` / ``max_failed_rows`` (the verdict itself is
tested in tests/unit/shared/test_manifest.py), on each path that reads a manifest: ``execute_complete``
after deferral, the worker's poll (``deferrable=False``), and a retry taking an earlier job's result.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import respx
from airflow.sdk import Asset
from airflow.sdk.exceptions import TaskDeferred
from structlog.testing import capture_logs

from airflow_provider_raybatch.operators import llm_batch as operator_module
from airflow_provider_raybatch.operators.llm_batch import JOB_ID_STATE_KEY, RayLLMBatchOperator
from airflow_provider_raybatch.shared.exceptions import (
    BatchSpecError,
    RayBatchRowsFailedError,
    RayJobFailedError,
)
from airflow_provider_raybatch.shared.manifest import failed_rows_verdict, manifest_log_line
from airflow_provider_raybatch.shared.specs import DEFAULT_MAX_FAILED_FRACTION
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.operators.test_llm_batch import (
    KEY,
    FakeCluster,
    FakeStateStore,
    FakeTI,
    make_operator,
    retry_ti,
    taken_manifest,
    task_try_of,
)

OUTPUT_ASSET = Asset("s3://b/out")


# Any (here and below): JSON values of a manifest.
def run_manifest(rows_in: int, rows_failed: int, duplicates: int = 0, **extra: Any) -> dict[str, Any]:
    """A committed run's manifest as the pipeline prints it (job j1's)."""
    reasons = {"missing id": rows_failed - duplicates}
    if duplicates:
        reasons["duplicate id"] = duplicates
    return {
        "status": "complete",
        "job_id": "j1",
        "output_uri": "s3://b/out/",
        "outputs_uri": "s3://b/out/versions/v1/outputs",
        "errors_uri": "s3://b/out/versions/v1/errors",
        "version": "v1",
        "rows_in": rows_in,
        "rows_out": rows_in - rows_failed,
        "rows_failed": rows_failed,
        "rows_duplicate": duplicates,
        "errors_by_reason": {kind: count for kind, count in reasons.items() if count},
        **extra,
    }


# Any: operator arguments; Airflow's outlet event accessors; the return value or the exception.
def complete(
    ray_conn: str, ray_api: respx.MockRouter, manifest: dict[str, Any], **kwargs: Any
) -> tuple[RayLLMBatchOperator, FakeTI, dict[Any, Any], Any]:
    """Resume a deferred task whose job j1 succeeded and printed ``manifest``: (operator, ti, outlet events,
    the return value or the exception raised)."""
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "x\n" + manifest_log_line(manifest) + "\n"})
    op = make_operator(ray_conn_id=ray_conn, output_asset=OUTPUT_ASSET, **kwargs)
    ti = FakeTI()
    outlet_events: dict[Any, Any] = defaultdict(lambda: SimpleNamespace(extra={}))
    try:
        outcome = op.execute_complete(
            {"ti": ti, "outlet_events": outlet_events}, job_event("success", "j1", "ok", "succeeded")
        )
    except RayBatchRowsFailedError as err:
        outcome = err
    return op, ti, outlet_events, outcome


def test_a_run_over_the_threshold_fails_after_pushing_the_xcoms(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    manifest = run_manifest(30, 4)  # 13.3% > 10%

    op, ti, outlet_events, outcome = complete(ray_conn, ray_api, manifest)

    assert isinstance(outcome, RayBatchRowsFailedError)
    assert str(outcome) == outcome.message == failed_rows_verdict(manifest, DEFAULT_MAX_FAILED_FRACTION, None)
    assert str(outcome) == (
        "4 of 30 rows failed (13.3%, duplicate ids not counted), over max_failed_fraction=0.1. "
        "Most common reasons: 'missing id' 4. "
        "Outputs and errors are committed: s3://b/out/versions/v1/outputs, s3://b/out/versions/v1/errors."
    )
    assert (outcome.rows_in, outcome.rows_failed, outcome.job_id) == (30, 4, "j1")
    # The result is committed and handed on all the same: a look at the errors starts from the XComs.
    assert ti.xcoms == {"job_id": "j1", "manifest": manifest, "output_uri": "s3://b/out/"}
    assert op.manifest == manifest  # for the failed task's lineage
    assert OUTPUT_ASSET not in outlet_events  # no Asset event: downstream DAGs must not start on it


@pytest.mark.parametrize(
    ("manifest", "kwargs", "passes"),
    [
        pytest.param(run_manifest(30, 3), {}, True, id="at-the-default-threshold"),
        pytest.param(run_manifest(30, 4), {"max_failed_fraction": 0.2}, True, id="under-a-looser-threshold"),
        pytest.param(run_manifest(30, 30), {"max_failed_fraction": 1.0}, False, id="every-row-failed"),
        pytest.param(run_manifest(30, 28, duplicates=28), {}, True, id="duplicate-ids-not-counted"),
        pytest.param(run_manifest(30, 11, duplicates=7), {}, False, id="the-rest-counted"),
        pytest.param(
            run_manifest(0, 0), {"max_failed_fraction": 0.0, "max_failed_rows": 0}, True, id="empty-input"
        ),
        pytest.param(run_manifest(1000, 3), {"max_failed_rows": 3}, True, id="at-max-failed-rows"),
        pytest.param(run_manifest(1000, 3), {"max_failed_rows": 2}, False, id="over-max-failed-rows"),
    ],
)
def test_the_thresholds_decide_the_task(
    ray_conn: str, ray_api: respx.MockRouter, manifest: dict[str, Any], kwargs: dict[str, Any], passes: bool
) -> None:
    op, ti, outlet_events, outcome = complete(ray_conn, ray_api, manifest, **kwargs)

    spec = op.build_spec()
    expected = failed_rows_verdict(manifest, spec.max_failed_fraction, spec.max_failed_rows)
    assert ti.xcoms["manifest"] == manifest  # pushed either way
    if passes:
        assert expected is None
        assert outcome == "s3://b/out/"
        assert outlet_events[OUTPUT_ASSET].extra["rows_failed"] == manifest["rows_failed"]
    else:
        assert isinstance(outcome, RayBatchRowsFailedError) and str(outcome) == expected
        assert OUTPUT_ASSET not in outlet_events


def test_every_row_failed_names_it(ray_conn: str, ray_api: respx.MockRouter) -> None:
    *_, outcome = complete(ray_conn, ray_api, run_manifest(30, 30), max_failed_fraction=1.0)

    assert "30 of 30 rows failed (100.0%" in str(outcome)
    assert "no row has an output, which fails a run whatever the thresholds" in str(outcome)


@pytest.mark.parametrize(
    ("recorded", "kwargs", "passes"), [(True, {}, False), (False, {"max_failed_fraction": 0.5}, True)]
)
def test_the_operator_judges_by_its_own_thresholds_not_the_manifests_check(
    ray_conn: str, ray_api: respx.MockRouter, recorded: bool, kwargs: dict[str, Any], passes: bool
) -> None:
    """The manifest's ``failed_rows_check`` was judged by the job's thresholds (or is missing, in a result
    from an older job); the task goes by the thresholds it has now."""
    check = {"passed": recorded, "message": None if recorded else "recorded verdict"}
    manifest = run_manifest(30, 9, failed_rows_check=check, max_failed_fraction=0.5 if recorded else 0.1)

    *_, outcome = complete(ray_conn, ray_api, manifest, **kwargs)

    assert (outcome == "s3://b/out/") is passes
    if not passes:
        assert str(outcome).startswith("9 of 30 rows failed (30.0%")


def test_the_worker_path_fails_the_same_way(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``deferrable=False``: the worker polls the job to SUCCEEDED, then judges its manifest."""
    cluster = FakeCluster(ray_api, job_payload)
    ti = FakeTI()
    manifest = run_manifest(30, 12)
    job_id = cluster.add_try(ti, 1, "RUNNING", manifest=manifest)
    manifest = {**manifest, "job_id": job_id}  # as the job printed it
    metadata = cluster.jobs[0]["metadata"]
    cluster.jobs.clear()  # submitted by this try: nothing earlier is listed
    statuses = [cluster.job_payload(job_id, status, metadata=metadata) for status in ("RUNNING", "SUCCEEDED")]
    cluster.gets[job_id].mock(side_effect=[httpx.Response(200, json=payload) for payload in statuses])
    monkeypatch.setattr(operator_module.time, "sleep", lambda _: None)
    op = make_operator(ray_conn_id=ray_conn, deferrable=False)

    with pytest.raises(RayBatchRowsFailedError) as info:
        op.execute({"ti": ti, "task_state_store": FakeStateStore()})

    assert str(info.value) == failed_rows_verdict(manifest, DEFAULT_MAX_FAILED_FRACTION, None)
    assert info.value.job_id == job_id
    assert [body["submission_id"] for body in cluster.submitted()] == [job_id]
    assert ti.xcoms["manifest"] == manifest and ti.xcoms["job_id"] == job_id
    assert not cluster.stops[job_id].called  # the job succeeded; nothing to stop


@pytest.mark.parametrize(("kwargs", "passes"), [({}, False), ({"max_failed_fraction": "0.5"}, True)])
def test_a_retry_takes_the_committed_result_and_fails_again_unless_loosened(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any, kwargs: dict[str, Any], passes: bool
) -> None:
    """The thresholds are not part of the spec fingerprint: try 2's job takes try 1's committed version
    (no rows paid twice) and the task fails with the same message, or passes once the thresholds were
    loosened: they are judged by Airflow, with the thresholds as they are now."""
    cluster = FakeCluster(ray_api, job_payload)
    ti = retry_ti(2)
    manifest = run_manifest(30, 12)
    earlier = cluster.add_try(ti, 1, "SUCCEEDED", manifest=manifest)
    op = make_operator(ray_conn_id=ray_conn, **kwargs)
    context = {"ti": ti, "task_state_store": FakeStateStore(**{JOB_ID_STATE_KEY: earlier})}
    with pytest.raises(TaskDeferred):
        op.execute(context)
    [body] = cluster.submitted()
    taken = taken_manifest(manifest, body["submission_id"], earlier)
    cluster.add_job(body["submission_id"], "SUCCEEDED", body["metadata"], logs=manifest_log_line(taken))
    done = job_event("success", body["submission_id"], "ok", "succeeded")

    if passes:
        assert op.execute_complete(context, done) == "s3://b/out/"
    else:
        with pytest.raises(RayBatchRowsFailedError) as info:
            op.execute_complete(context, done)
        assert str(info.value) == failed_rows_verdict(manifest, DEFAULT_MAX_FAILED_FRACTION, None)
    assert ti.xcoms["job_id"] == body["submission_id"]


# -- the parameters --------------------------------------------------------------------------------


def test_the_thresholds_reach_the_spec_but_not_its_fingerprint() -> None:
    spec = make_operator(max_failed_fraction=0.25, max_failed_rows=7).build_spec()

    assert (spec.max_failed_fraction, spec.max_failed_rows) == (0.25, 7)
    default = make_operator().build_spec()
    assert (default.max_failed_fraction, default.max_failed_rows) == (DEFAULT_MAX_FAILED_FRACTION, None)
    assert spec.fingerprint() == default.fingerprint()


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("max_failed_fraction", "0.25", 0.25),
        ("max_failed_fraction", " 1 ", 1.0),
        ("max_failed_fraction", "None", DEFAULT_MAX_FAILED_FRACTION),
        ("max_failed_fraction", "", DEFAULT_MAX_FAILED_FRACTION),
        ("max_failed_rows", "100", 100),
        ("max_failed_rows", "null", None),
        ("max_failed_rows", "None", None),
    ],
)
def test_the_thresholds_are_templated(name: str, text: str, expected: float | None) -> None:
    assert {"max_failed_fraction", "max_failed_rows"} <= set(RayLLMBatchOperator.template_fields)
    op = make_operator()
    setattr(op, name, text)  # as rendering "{{ params.max_failed_fraction }}" would

    assert getattr(op.build_spec(), name) == expected


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_failed_fraction": 1.5}, "max_failed_fraction=1.5 must be at most 1.0"),
        ({"max_failed_fraction": "-0.1"}, "max_failed_fraction='-0.1' must be at least 0.0"),
        ({"max_failed_rows": -1}, "max_failed_rows=-1 must be at least 0"),
        ({"max_failed_rows": "many"}, "max_failed_rows"),
    ],
)
def test_an_invalid_threshold_names_the_parameter(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(BatchSpecError, match=fragment):
        make_operator(**kwargs).build_spec()


def test_the_done_line_says_how_many_failed_rows_are_repeated_ids(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    """The thresholds leave repeated ids out: the log's failed count says how many of them it holds."""
    with capture_logs() as events:
        complete(ray_conn, ray_api, run_manifest(30, 11, duplicates=7), max_failed_fraction=1.0)
        complete(ray_conn, ray_api, run_manifest(30, 4), max_failed_fraction=1.0)

    lines = [event["event"] % tuple(event.get("positional_args", ())) for event in events]
    assert [line for line in lines if line.startswith("Ray job j1 done")] == [
        "Ray job j1 done: 30 rows in, 19 out, 11 failed (7 of them repeated ids); output at s3://b/out/.",
        "Ray job j1 done: 30 rows in, 26 out, 4 failed; output at s3://b/out/.",
    ]


# -- a run held for its failed rows (pipeline/stage/commit.hold): its job failed, nothing committed --


def held_job(
    cluster: FakeCluster, ti: FakeTI, **manifest_fields: Any
) -> tuple[str, dict[str, Any]]:  # Any: JSON.
    """Try 1's job, FAILED after printing the manifest of the run it held: (its id, that manifest)."""
    job_id = task_try_of(ti, 1).submission_id(KEY)
    spec = make_operator().build_spec(run_key=task_try_of(ti, 1).run_key())
    fields = {
        "status": "held",
        "current_version": "v0",
        "job_id": job_id,
        "run_key": spec.run_key,
        "spec_fingerprint": spec.fingerprint(),
        "report_uri": "s3://b/out/versions/v1/report.html",
    }
    manifest = run_manifest(30, 30, **{**fields, **manifest_fields})
    logs = "x\n" + manifest_log_line(manifest) + "\nERROR 30 of 30 rows failed\n"
    cluster.add_try(ti, 1, "FAILED", logs=logs)
    return job_id, manifest


def test_a_held_run_fails_its_task_saying_what_stays_current(ray_conn: str, cluster: FakeCluster) -> None:
    """Every row failed (a wrong column) and the run replaced the date's good
    version. Now the job holds it and fails; the task says so in one error, with no log tail."""
    ti = retry_ti(1)
    job_id, manifest = held_job(cluster, ti)
    failed = job_event("error", job_id, f"Ray job {job_id} finished: FAILED.", "failed")

    with pytest.raises(RayBatchRowsFailedError) as info:
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, failed)

    message = str(info.value)
    assert message.startswith("30 of 30 rows failed (100.0%, duplicate ids not counted)")
    assert "Nothing was committed: s3://b/out/ is as it was (version v0 stays current)." in message
    assert "its report at s3://b/out/versions/v1/report.html." in message
    assert "Fix the input or the parameters: a retry then starts afresh." in message  # no threshold helps
    assert (
        "errors are kept until its next try, for a look at s3://b/out/versions/v1/errors," in message
    )  # no empty outputs
    assert "driver log" not in message
    assert (info.value.rows_in, info.value.rows_failed, info.value.job_id) == (30, 30, job_id)
    assert ti.xcoms["manifest"] == manifest and "output_uri" not in ti.xcoms


def test_a_retry_of_a_held_run_submits_a_job_to_commit_it(ray_conn: str, cluster: FakeCluster) -> None:
    """The held job FAILED and committed nothing: the retry submits, and that job finds every row staged."""
    ti = retry_ti(2)
    held_job(cluster, ti)

    with pytest.raises(TaskDeferred):
        make_operator(ray_conn_id=ray_conn, max_failed_fraction=1.0).execute(
            {"ti": ti, "task_state_store": FakeStateStore()}
        )

    assert [body["submission_id"] for body in cluster.submitted()] == [task_try_of(ti, 2).submission_id(KEY)]


@pytest.mark.parametrize("other", [{"spec_fingerprint": "another"}, {"job_id": "raybatch-someone-else"}])
def test_a_held_manifest_of_another_run_is_not_taken(
    ray_conn: str, cluster: FakeCluster, other: dict[str, str]
) -> None:
    ti = retry_ti(1)
    job_id, _ = held_job(cluster, ti, **other)
    failed = job_event("error", job_id, f"Ray job {job_id} finished: FAILED.", "failed")

    with pytest.raises(RayJobFailedError, match="driver log"):
        make_operator(ray_conn_id=ray_conn).execute_complete({"ti": ti}, failed)


def test_the_task_says_which_version_its_commit_replaced(ray_conn: str, ray_api: respx.MockRouter) -> None:
    """A re-run committed a new version and deleted the good one, and the task log
    said nothing of it."""
    with capture_logs() as events:
        complete(ray_conn, ray_api, run_manifest(30, 0, replaced_version="v0"))

    lines = [event["event"] % tuple(event.get("positional_args", ())) for event in events]
    assert "Ray job j1's version v1 replaced version v0 at s3://b/out/ (deleted)." in lines


def test_a_commit_of_held_rows_says_which_job_generated_them_and_what_that_took(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    """The job that committed a held try's rows showed no engine time and no GPU-seconds, as
    if the rows had cost nothing."""
    timings = {"generating_s": 41.5, "replicas": 1, "gpus_per_replica": 1.0, "gpu_seconds_held": 60.2}
    held_try = {"job_id": "j0", "version": "v1", "engine_pool": None, "timings": timings}
    with capture_logs() as events:
        complete(ray_conn, ray_api, run_manifest(30, 0, held_try=held_try))

    lines = [event["event"] % tuple(event.get("positional_args", ())) for event in events]
    assert (
        "Ray job j1 generated no rows: it committed the rows Ray job j0 generated and held, which took: "
        "generating 41.5 s; 60.2 GPU-seconds held (1 replica x 1 GPU)." in lines
    ), lines


def test_a_held_try_without_a_job_id_or_timings_is_an_earlier_try(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    with capture_logs() as events:
        complete(ray_conn, ray_api, run_manifest(30, 0, held_try={"version": "v1"}))

    lines = [event["event"] % tuple(event.get("positional_args", ())) for event in events]
    assert "Ray job j1 generated no rows: it committed the rows an earlier try generated and held." in lines
