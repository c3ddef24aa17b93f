"""Tests of airflow_provider_raybatch/lineage.py and the operator's get_openlineage_facets_* methods."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import respx
from airflow.providers.openlineage.extractors.base import DefaultExtractor
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from openlineage.client.serde import Serde

from airflow_provider_raybatch.lineage import dataset_name, operator_lineage
from airflow_provider_raybatch.shared.exceptions import RayJobFailedError
from airflow_provider_raybatch.shared.manifest import manifest_log_line
from airflow_provider_raybatch.utils.events import job_event
from tests.unit.conftest import RAY_TOKEN
from tests.unit.operators.test_llm_batch import FakeTI, make_operator

MANIFEST = {
    "status": "complete",
    "job_id": "j1",
    "version": "20261121T000000-ab12",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "input_uri": "/data/customers/2026-11-21/customers.csv",
    "output_uri": "s3://b/company_industry/2026-11-21",
    "outputs_uri": "s3://b/company_industry/2026-11-21/versions/20261121T000000-ab12/outputs",
    "rows_in": 250,
    "rows_out": 247,
    "rows_failed": 3,
    "rows_duplicate": 1,
    "rows_resumed": 0,
    "errors_by_reason": {"duplicate id": 1, "missing column": 2},
    "tokens_in": 9000,
    "tokens_out": 750,
    "wall_seconds": 42.5,
    "spec_fingerprint": "0123456789abcdef",
    "versions": {"ray": "2.60.0", "vllm": "0.32.0"},
}
HF_TOKEN = "hf_n0t-for-lineage"


def lineage_operator(**kwargs: Any):  # Any: operator arguments.
    return make_operator(
        input_uri=MANIFEST["input_uri"],
        output_uri=MANIFEST["output_uri"],
        system_prompt="Answer with the label only.",
        sampling_params={"temperature": 0, "max_tokens": 16},
        engine_kwargs={"max_model_len": 512, "hf_token": HF_TOKEN},
        **kwargs,
    )


def completed(ray_conn: str, ray_api: respx.MockRouter, **kwargs: Any):  # Any: operator arguments.
    """An operator whose execute_complete has read MANIFEST from job j1's log."""
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "x\n" + manifest_log_line(MANIFEST) + "\n"})
    operator = lineage_operator(ray_conn_id=ray_conn, **kwargs)
    operator.execute_complete({"ti": FakeTI()}, job_event("success", "j1", "ok", "succeeded"))
    return operator


def as_json(value: Any) -> Any:  # Any: OpenLineage objects (or lists, dicts of them), and their JSON form.
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return json.loads(Serde.to_json(value))


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/in/day/customers.csv", ("s3://bucket", "in/day/customers.csv")),
        ("s3://bucket/out/day/", ("s3://bucket", "out/day")),
        ("s3://bucket", ("s3://bucket", "/")),
        ("/data/in/customers.jsonl", ("file", "/data/in/customers.jsonl")),
        ("/data/out/day/", ("file", "/data/out/day")),
        ("file:///data/out", ("file", "/data/out")),
        ("file://nfs-host/data/out", ("file://nfs-host", "/data/out")),
    ],
)
def test_dataset_names_follow_the_openlineage_conventions(uri: str, expected: tuple[str, str]) -> None:
    assert dataset_name(uri) == expected


def test_on_start_names_the_datasets_and_the_batch() -> None:
    lineage = lineage_operator().get_openlineage_facets_on_start()

    ((input_dataset,), (output_dataset,)) = (lineage.inputs, lineage.outputs)
    assert (input_dataset.namespace, input_dataset.name) == ("file", MANIFEST["input_uri"])
    assert (output_dataset.namespace, output_dataset.name) == ("s3://b", "company_industry/2026-11-21")
    assert input_dataset.inputFacets == {} and output_dataset.outputFacets == {}
    assert lineage.run_facets == {}
    job = as_json(lineage.job_facets["raybatch_job"])
    assert {key: value for key, value in job.items() if not key.startswith("_")} == {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "outputFormat": "parquet",
        "systemPrompt": "Answer with the label only.",
        "userTemplate": "Industry of {Company}?",
        "samplingParams": {"temperature": 0, "max_tokens": 16},
    }


def test_on_complete_carries_the_counts_version_and_ray_job(ray_conn: str, ray_api: respx.MockRouter) -> None:
    lineage = completed(ray_conn, ray_api).get_openlineage_facets_on_complete(FakeTI())

    ((input_dataset,), (output_dataset,)) = (lineage.inputs, lineage.outputs)
    assert as_json(input_dataset.inputFacets["inputStatistics"])["rowCount"] == 250
    assert as_json(output_dataset.outputFacets["outputStatistics"])["rowCount"] == 247
    assert output_dataset.facets["version"].datasetVersion == "20261121T000000-ab12"
    (location,) = output_dataset.facets["symlinks"].identifiers
    assert (location.namespace, location.name, location.type) == (
        "s3://b",
        "company_industry/2026-11-21/versions/20261121T000000-ab12/outputs",
        "LOCATION",
    )
    external = lineage.run_facets["externalQuery"]
    assert (external.externalQueryId, external.source) == ("j1", "ray")
    run = as_json(lineage.run_facets["raybatch_run"])
    assert {key: value for key, value in run.items() if not key.startswith("_")} == {
        "jobId": "j1",
        "specFingerprint": "0123456789abcdef",
        "version": "20261121T000000-ab12",
        "rowsIn": 250,
        "rowsOut": 247,
        "rowsFailed": 3,
        "rowsDuplicate": 1,
        "rowsResumed": 0,
        "tokensIn": 9000,
        "tokensOut": 750,
        "wallSeconds": 42.5,
        "errorsByReason": {"duplicate id": 1, "missing column": 2},
        "versions": {"ray": "2.60.0", "vllm": "0.32.0"},
    }


def test_a_manifest_without_counts_gives_no_row_counts() -> None:
    """A count the manifest does not name is unknown, not 0 rows: no statistics facet, and no count in
    the run facet."""
    lineage = operator_lineage("s3://b/in", "s3://b/out", manifest={"status": "complete", "version": "v1"})

    ((input_dataset,), (output_dataset,)) = (lineage.inputs, lineage.outputs)
    assert input_dataset.inputFacets == {} and output_dataset.outputFacets == {}
    assert output_dataset.facets["version"].datasetVersion == "v1"
    run = lineage.run_facets["raybatch_run"]
    assert (run.rowsIn, run.rowsOut, run.rowsFailed, run.version) == (None, None, None, "v1")


def test_the_provider_extracts_through_the_operator_methods(ray_conn: str, ray_api: respx.MockRouter) -> None:
    operator = completed(ray_conn, ray_api)
    assert ExtractorManager().get_extractor_class(operator) is DefaultExtractor

    lineage = DefaultExtractor(operator).extract_on_complete(FakeTI())

    assert lineage is not None
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://b", "company_industry/2026-11-21")]
    assert set(lineage.run_facets) == {"externalQuery", "raybatch_run"}


def test_lineage_carries_no_secret(ray_conn: str, ray_api: respx.MockRouter) -> None:
    operator = completed(ray_conn, ray_api, aws_conn_id="aws_default")

    lineage = operator.get_openlineage_facets_on_complete(FakeTI())

    parts = (lineage.inputs, lineage.outputs, lineage.run_facets, lineage.job_facets)
    text = json.dumps([as_json(part) for part in parts])
    assert "/data/customers" in text  # the serialization did happen
    for secret in (RAY_TOKEN, HF_TOKEN, "hf_token", "engine", "aws_default"):
        assert secret not in text


def test_a_failed_job_still_names_the_datasets_and_the_job(ray_conn: str, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "RuntimeError: boom\n"})
    operator = lineage_operator(ray_conn_id=ray_conn)
    with pytest.raises(RayJobFailedError):
        operator.execute_complete({"ti": FakeTI()}, job_event("error", "j1", "failed", "failed"))

    lineage = operator.get_openlineage_facets_on_complete(FakeTI())

    assert [(d.namespace, d.name) for d in lineage.inputs] == [("file", MANIFEST["input_uri"])]
    assert lineage.outputs[0].outputFacets == {} and lineage.outputs[0].facets == {}
    assert set(lineage.run_facets) == {"externalQuery"}


def test_an_invalid_spec_still_names_the_datasets() -> None:
    op = lineage_operator()
    op.batch_size = 0  # set after the task was built (a literal 0 fails as it is built)
    lineage = op.get_openlineage_facets_on_start()

    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://b", "company_industry/2026-11-21")]
    assert lineage.job_facets == {}


def test_without_openlineage_the_operator_runs_and_only_lineage_is_unavailable(
    ray_conn: str, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [*sys.modules, "openlineage", "airflow.providers.openlineage"]:
        if name.split(".")[0] == "openlineage" or name.startswith("airflow.providers.openlineage"):
            monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: importing it raises
    monkeypatch.delitem(sys.modules, "airflow_provider_raybatch.lineage", raising=False)

    operator = completed(ray_conn, ray_api)

    assert operator.manifest == MANIFEST
    with pytest.raises(ImportError):
        operator.get_openlineage_facets_on_complete(FakeTI())


def test_an_odd_manifest_gives_what_it_can_and_never_fails_the_task() -> None:
    """Lineage decides nothing: a count of another type is no count, a version of another type is
    still the version (as text)."""
    manifest = {"status": "complete", "version": 3, "rows_in": None, "rows_out": "many"}
    lineage = operator_lineage("s3://b/in", "s3://b/out", manifest=manifest)

    ((input_dataset,), (output_dataset,)) = (lineage.inputs, lineage.outputs)
    assert input_dataset.inputFacets == {} and output_dataset.outputFacets == {}
    assert output_dataset.facets["version"].datasetVersion == "3"
    run = lineage.run_facets["raybatch_run"]
    assert (run.rowsIn, run.rowsOut, run.version) == (None, None, "3")
