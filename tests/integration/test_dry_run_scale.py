"""A dry run over many generated customer rows, as a real Ray job: the pre-engine path at a size CI affords.

The cluster path of duplicate detection (hash partitions of the ids, taken above 1,000,000 rows) is forced on
with ``RAYBATCH_DRIVER_SCAN_MAX_ROWS``; bench/prepath.py runs the same at 20,000,000 rows.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.manifest import manifest_from_log
from tests.conftest import ROOT, submit_pipeline, wait_for_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# Past RAYBATCH_DRIVER_SCAN_MAX_ROWS (1,000 here) in three files: the cluster's hash partitions, ids
# repeated across files; bench/prepath.py runs the same path at 20,000,000 rows.
ROWS, ROWS_PER_FILE = 6_000, 2_000


def _customers_module():
    spec = importlib.util.spec_from_file_location(
        "make_sample_customers", ROOT / "scripts" / "make_sample_customers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_dry_run_of_many_rows_counts_every_row_once_and_commits_nothing(
    ray_connection, tiny_model, tmp_path: Path
) -> None:
    input_dir = tmp_path / "customers"
    duplicates, without_id = _customers_module().write_customer_files(input_dir, ROWS, ROWS_PER_FILE)
    output_uri = tmp_path / "out"
    operator = RayLLMBatchOperator(
        task_id="classify_industry",
        model=str(tiny_model),
        input_uri=str(input_dir),
        output_uri=str(output_uri),
        input_format="csv",
        system_prompt="You classify companies by industry. Answer with the label only.",
        user_template="What industry is this company in: {Company}",
        id_column="Customer Id",
        sampling_params={"temperature": 0, "max_tokens": 16},
        dry_run=True,
        dry_run_rows_per_second=250.0,
        runtime_env={"env_vars": {"RAYBATCH_DRIVER_SCAN_MAX_ROWS": "1000"}},  # the cluster's hash partitions
    )
    job_id = submit_pipeline(operator, "scale", f"dry-scale-{uuid.uuid4().hex[:8]}")
    hook = RayHook()
    assert wait_for_job(job_id) == JobStatus.SUCCEEDED, hook.get_job_log_tail(job_id, 80)

    manifest = json.loads((output_uri / "_dry_runs" / "scale" / "manifest.json").read_text())
    assert manifest == manifest_from_log(hook.get_job_logs(job_id))
    assert (duplicates, without_id) == (ROWS // 100 - ROWS // 200, ROWS // 200)
    assert manifest["errors_by_reason"] == {"duplicate id": duplicates, "missing id": without_id}
    assert manifest["rows_duplicate"] == duplicates
    assert manifest["rows_in"] == ROWS == manifest["rows_out"] + manifest["rows_failed"]
    assert sum(bucket["rows"] for bucket in manifest["prompt_tokens_histogram"]) == manifest["rows_out"]
    assert manifest["prompt_tokens"] >= manifest["rows_out"] * 10  # the system prompt alone is longer
    assert manifest["output_tokens_at_most"] == manifest["rows_out"] * 16
    assert manifest["estimated_gpu_seconds"] == -(-manifest["rows_out"] // 250)
    assert manifest["rows_per_second_from"] == "dry_run_rows_per_second"
    assert sorted(path.name for path in output_uri.iterdir()) == ["_dry_runs"]  # nothing committed or staged
