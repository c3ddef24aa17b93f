"""The operator's dry run (``dry_run=True``): its manifest, its log line, its thresholds, no Asset event.

The pipeline's side (render, tokenize, count on a real cluster) is in
tests/integration/test_pipeline_job.py; the manifest's folder is tested here on local disk.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import respx
import structlog

from airflow_provider_raybatch.shared.exceptions import RayBatchRowsFailedError
from airflow_provider_raybatch.shared.manifest import dry_run_uri, manifest_log_line
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.operators.test_failed_rows import OUTPUT_ASSET, complete
from tests.unit.operators.test_llm_batch import FakeTI, make_operator


def dry_manifest(
    rows_in: int, rows_failed: int, job_id: str = "j1", **extra: Any
) -> dict[str, Any]:  # Any: JSON.
    return {
        "status": "dry_run",
        "dry_run": True,
        "job_id": job_id,
        "output_uri": "s3://b/out/",
        "dry_run_uri": dry_run_uri("s3://b/out/", "k"),
        "rows_in": rows_in,
        "rows_out": rows_in - rows_failed,
        "rows_failed": rows_failed,
        "rows_duplicate": 0,
        "errors_by_reason": {"prompt too long": rows_failed} if rows_failed else {},
        "prompt_tokens": 1234,
        "prompt_tokens_longest": 99,
        "rows_per_second": 50.0,
        "rows_per_second_from": "dry_run_rows_per_second",
        "estimated_gpu_seconds": 2,
        **extra,
    }


def _logged(run: Any) -> str:  # Any: a callable that logs through the operator's (structlog) logger
    with structlog.testing.capture_logs() as events:
        run()
    return "\n".join(str(event.get("event")) for event in events)


def test_a_dry_run_returns_its_folder_and_announces_no_output(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    manifest = dry_manifest(100, 2)
    done: list[Any] = []  # Any: complete()'s tuple
    text = _logged(lambda: done.append(complete(ray_conn, ray_api, manifest, dry_run=True)))
    op, ti, outlet_events, outcome = done[0]
    assert outcome == manifest["dry_run_uri"] == "s3://b/out/_dry_runs/k"
    assert ti.xcoms["manifest"] == manifest and ti.xcoms["job_id"] == "j1"
    assert "output_uri" not in ti.xcoms  # nothing was written there
    assert op.outlets == [] and OUTPUT_ASSET not in outlet_events  # no Asset event for a dry run
    assert "98 would reach the engine with 1234 prompt tokens" in text
    assert "~2 s of engine time at 50 rows/s (dry_run_rows_per_second)" in text


def test_a_dry_run_logs_its_engine_time_and_the_gpu_seconds_of_all_replicas(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    manifest = dry_manifest(
        1000, 0, rows_per_second=10.0, estimated_engine_seconds=150, estimated_gpu_seconds=600
    )
    text = _logged(lambda: complete(ray_conn, ray_api, manifest, dry_run=True))
    assert "~150 s of engine time (600 GPU-seconds) at 10 rows/s (dry_run_rows_per_second)" in text
    no_rate = dry_manifest(
        10,
        0,
        rows_per_second=None,
        rows_per_second_from=None,
        estimated_engine_seconds=None,
        estimated_gpu_seconds=None,
    )
    text = _logged(lambda: complete(ray_conn, ray_api, no_rate, dry_run=True))
    assert "no GPU time estimate (set dry_run_rows_per_second, or run once for real)" in text


def test_a_dry_run_without_a_throughput_says_how_to_get_an_estimate(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    manifest = dry_manifest(
        10, 0, rows_per_second=None, rows_per_second_from=None, estimated_gpu_seconds=None
    )
    text = _logged(lambda: complete(ray_conn, ray_api, manifest, dry_run=True))
    assert "no GPU time estimate (set dry_run_rows_per_second, or run once for real)" in text


def test_a_dry_run_fails_when_the_real_run_would_fail_its_thresholds(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    _, ti, _, outcome = complete(ray_conn, ray_api, dry_manifest(100, 30), dry_run=True)
    assert isinstance(outcome, RayBatchRowsFailedError)
    assert str(outcome).startswith("Dry run: the real run would fail: 30 of 100 rows failed")
    assert "'prompt too long' 30" in str(outcome) and "s3://b/out/_dry_runs/k" in str(outcome)
    assert ti.xcoms["manifest"]["rows_failed"] == 30  # the counts are there to look at


def test_a_real_runs_committed_manifest_is_not_a_dry_runs_result(
    ray_conn: str, ray_api: respx.MockRouter, tmp_path: Any
) -> None:
    """The dry run reads its own folder; a complete manifest at output_uri (the last real run) is not it,
    and a dry-run manifest left there by another job is not it either: the driver log is read instead."""
    output_uri = str(tmp_path / "out")
    op = make_operator(ray_conn_id=ray_conn, output_uri=output_uri, dry_run=True)
    run_key = "k"
    folder = tmp_path / "out" / "_dry_runs" / run_key
    folder.mkdir(parents=True)
    (tmp_path / "out" / "manifest.json").write_text(
        json.dumps({"status": "complete", "job_id": "j1", "rows_in": 5})
    )
    (folder / "manifest.json").write_text(json.dumps(dry_manifest(7, 0, job_id="someone-else")))
    from_log = dry_manifest(100, 0, output_uri=output_uri)
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": manifest_log_line(from_log) + "\n"})
    ti = FakeTI()
    op.build_spec = lambda run_key="manual", _build=op.build_spec: _build(run_key="k")  # type: ignore[method-assign]
    op.execute_complete({"ti": ti, "outlet_events": {}}, job_event("success", "j1", "ok", "succeeded"))
    assert ti.xcoms["manifest"] == from_log
    (folder / "manifest.json").write_text(json.dumps(dry_manifest(8, 0, output_uri=output_uri)))
    ti = FakeTI()
    op.execute_complete({"ti": ti, "outlet_events": {}}, job_event("success", "j1", "ok", "succeeded"))
    assert ti.xcoms["manifest"]["rows_in"] == 8  # its own, read from its folder


def test_dry_run_is_part_of_the_fingerprint_and_the_rate_is_not() -> None:
    plain, dry = make_operator().build_spec(), make_operator(dry_run=True).build_spec()
    assert plain.fingerprint() != dry.fingerprint()  # a real run's staging or manifest is never a dry run's
    rated = make_operator(dry_run=True, dry_run_rows_per_second=12.5).build_spec()
    assert rated.fingerprint() == dry.fingerprint() and rated.dry_run_rows_per_second == 12.5
    with pytest.raises(Exception, match="dry_run_rows_per_second"):
        make_operator(dry_run=True, dry_run_rows_per_second=-1).build_spec()
