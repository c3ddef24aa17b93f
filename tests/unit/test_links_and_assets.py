"""Extra links (Ray job page, output location) and the output Asset event with its extras."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import respx
from airflow.sdk import Asset

from airflow_provider_raybatch import get_provider_info
from airflow_provider_raybatch.links import (
    BatchOutputLink,
    RayJobLink,
    RunReportLink,
    output_location_url,
    ray_job_url,
)
from airflow_provider_raybatch.shared.manifest import manifest_log_line
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.operators.test_llm_batch import FakeTI, make_operator

MANIFEST = {
    "status": "complete",
    "job_id": "j1",
    "output_uri": "s3://b/out/2026-11-20",
    "outputs_uri": "s3://b/out/2026-11-20/versions/v1/outputs",
    "rows_in": 30,
    "rows_out": 29,
    "rows_failed": 1,
    "version": "v1",
}


def test_ray_job_url_points_at_the_dashboards_job_page() -> None:
    assert (
        ray_job_url("https://ray.example.com/", "raybatch-d-t-1")
        == "https://ray.example.com/#/jobs/raybatch-d-t-1"
    )
    assert ray_job_url("http://127.0.0.1:8265", "a b/c") == "http://127.0.0.1:8265/#/jobs/a%20b%2Fc"


@pytest.mark.parametrize(
    ("uri", "url"),
    [
        (
            "s3://bucket/out/2026-11-20",
            "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix=out/2026-11-20/",
        ),
        ("s3://bucket", "https://s3.console.aws.amazon.com/s3/buckets/bucket?prefix="),
        ("/data/out dir", "file:///data/out%20dir"),
        ("gs://b/x", "gs://b/x"),
    ],
)
def test_output_location_url(uri: str, url: str) -> None:
    assert output_location_url(uri) == url


def test_links_read_the_job_from_the_operator_the_dashboard_from_xcom_and_the_report_from_the_manifest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored: dict[str, Any] = {
        "job_id": "raybatch-j1",
        "ray_dashboard_url": "http://ray.test:8265",
    }
    monkeypatch.setattr(
        "airflow.sdk.execution_time.xcom.XCom.get_value", lambda *, ti_key, key: stored.get(key), raising=True
    )
    operator = make_operator(output_uri="/data/out")
    key = SimpleNamespace(dag_id="d", task_id="t", run_id="r", try_number=1, map_index=-1)
    assert RunReportLink().get_link(operator, ti_key=key) == ""  # deferred: no manifest yet, nothing pulled
    assert RayJobLink().get_link(operator, ti_key=key) == ""  # no job of its own yet: nothing pulled
    operator.job_id = "raybatch-j1"  # as execute sets it when it submits, or execute_complete from the event
    operator.manifest = {"report_uri": "s3://b/out/versions/v1/report.html"}  # what execute_complete read

    assert RayJobLink().get_link(operator, ti_key=key) == "http://ray.test:8265/#/jobs/raybatch-j1"
    assert BatchOutputLink().get_link(operator, ti_key=key) == "file:///data/out"
    assert RunReportLink().get_link(operator, ti_key=key) == (
        "https://s3.console.aws.amazon.com/s3/object/b?prefix=out/versions/v1/report.html"
    )
    stored.clear()
    assert RayJobLink().get_link(operator, ti_key=key) == ""  # no dashboard address pushed: no link


def test_links_are_declared_on_the_operator_and_in_the_provider_info() -> None:
    names = {type(link).__name__ for link in make_operator().operator_extra_links}
    declared = {path.rpartition(".")[2] for path in get_provider_info()["extra-links"]}
    assert names == declared == {"RayJobLink", "BatchOutputLink", "RunReportLink"}


def test_assets_become_outlets_and_inlets() -> None:
    operator = make_operator(output_asset="s3://b/out", input_asset=Asset("s3://b/in"))

    assert operator.outlets == [Asset("s3://b/out")]
    assert operator.inlets == [Asset("s3://b/in")]
    assert make_operator().outlets == []


def test_success_emits_the_asset_event_with_the_runs_extras(ray_conn: str, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": manifest_log_line(MANIFEST)})
    asset = Asset("s3://b/out")
    outlet_events: dict[Any, Any] = defaultdict(lambda: SimpleNamespace(extra={}))
    operator = make_operator(ray_conn_id=ray_conn, output_asset=asset)

    operator.execute_complete(
        {"ti": FakeTI(), "outlet_events": outlet_events}, job_event("success", "j1", "ok", "succeeded")
    )

    assert outlet_events[asset].extra == {
        "output_uri": "s3://b/out/2026-11-20",
        "manifest_uri": "s3://b/out/2026-11-20/manifest.json",
        "outputs_uri": "s3://b/out/2026-11-20/versions/v1/outputs",
        "rows_in": 30,
        "rows_out": 29,
        "rows_failed": 1,
        "version": "v1",
        "job_id": "j1",
    }
