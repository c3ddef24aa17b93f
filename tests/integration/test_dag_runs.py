"""The example DAGs through real Airflow (`airflow dags test`, deferrable path) on the local cluster: the
README's first DAG and the fuller daily one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA, ROOT, run_date, warm_conf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

sys.path.insert(0, str(ROOT / "dags"))
sys.path.insert(0, str(ROOT / "scripts"))
from daily_company_industry import INDUSTRIES  # noqa: E402
from make_sample_customers import write_customers_csv  # noqa: E402

DAG_ID = "daily_company_industry"


def _conf(model: Path, data_root: Path) -> dict:
    return {
        "model": str(model),
        "data_root": str(data_root),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
        **warm_conf(),
    }


def _task_events(lineage_file: Path, job_name: str) -> dict[str, dict]:
    """The OpenLineage events the file transport wrote for one job (``<dag>.<task>``), by type."""
    events = [json.loads(line) for line in lineage_file.read_text().splitlines() if line.strip()]
    return {event["eventType"]: event for event in events if event["job"]["name"] == job_name}


def test_daily_dag_classifies_every_customer(airflow_env, ray_cluster, tiny_model, tmp_path) -> None:
    day, rows = "2026-11-19", 60
    write_customers_csv(tmp_path / "customers" / day / "customers.csv", day, rows)
    # The OpenLineage provider is on for this run, writing its events to a file.
    lineage_file = tmp_path / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(lineage_file), "append": True}

    result = airflow_env.with_env(AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(transport)).dags_test(
        DAG_ID, run_date(day), _conf(tiny_model, tmp_path)
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "state=success" in log, log[-4000:]
    # The task deferred: the trigger, not the worker, waited for the job.
    assert "RayJobTrigger" in log
    # A run that succeeds logs no error-level line (Airflow's "[error] XCom not found" at deferral was one).
    assert not [line for line in log.splitlines() if "[error" in line.lower() or " ERROR " in line], log[
        -4000:
    ]

    xcoms = airflow_env.xcoms(DAG_ID, run_date(day))
    output_uri = str(tmp_path / "company_industry" / day)
    assert xcoms[("classify_industry", "return_value")] == output_uri
    assert xcoms[("classify_industry", "output_uri")] == output_uri
    assert str(xcoms[("classify_industry", "job_id")]).startswith(
        "raybatch-daily_company_industry-classify_industry-"
    )
    manifest = xcoms[("classify_industry", "manifest")]
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (rows, rows, 0)
    assert set(manifest["generated_text_counts"]) <= set(INDUSTRIES)
    assert xcoms[("log_industry_counts", "return_value")] == manifest["generated_text_counts"]

    assert manifest["outputs_uri"].startswith(f"{output_uri}/versions/")
    outputs = pq.read_table(manifest["outputs_uri"]).to_pylist()
    assert len(outputs) == rows
    assert len({row["Customer Id"] for row in outputs}) == rows
    assert {row["generated_text"] for row in outputs} <= set(INDUSTRIES)
    for industry, count in manifest["generated_text_counts"].items():
        assert f"industry {industry}" in log and str(count) in log

    # Lineage: the input file and the output folder, with this run's row counts and version.
    events = _task_events(lineage_file, f"{DAG_ID}.classify_industry")
    assert {"START", "COMPLETE"} <= set(events), sorted(events)
    complete = events["COMPLETE"]
    (dataset_in,) = complete["inputs"]
    (dataset_out,) = complete["outputs"]
    input_path = str(tmp_path / "customers" / day / "customers.csv")
    assert (dataset_in["namespace"], dataset_in["name"]) == ("file", input_path)
    assert dataset_in["inputFacets"]["inputStatistics"]["rowCount"] == rows
    assert (dataset_out["namespace"], dataset_out["name"]) == ("file", output_uri)
    assert dataset_out["outputFacets"]["outputStatistics"]["rowCount"] == rows
    assert dataset_out["facets"]["version"]["datasetVersion"] == manifest["version"]
    assert dataset_out["facets"]["symlinks"]["identifiers"][0]["name"] == manifest["outputs_uri"]
    run_facets = complete["run"]["facets"]
    assert run_facets["externalQuery"]["externalQueryId"] == xcoms[("classify_industry", "job_id")]
    assert run_facets["raybatch_run"]["rowsIn"] == rows
    assert complete["job"]["facets"]["raybatch_job"]["model"] == str(tiny_model)
    start = events["START"]
    assert [(d["namespace"], d["name"]) for d in start["inputs"] + start["outputs"]] == [
        ("file", input_path),
        ("file", output_uri),
    ]
    assert ray_cluster.token not in lineage_file.read_text()

    # The same date again, later that day (another run, the same output folder), after the file's id
    # column was renamed: every row fails. The run is held: the task fails saying so, and the date's
    # good version stays current and whole (not replaced by a version of 0 rows).
    csv = tmp_path / "customers" / day / "customers.csv"
    csv.write_text(csv.read_text().replace("Customer Id", "Customer ID", 1))
    later = f"{run_date(day)}T06:00:00+00:00"
    rerun = airflow_env.dags_test(DAG_ID, later, _conf(tiny_model, tmp_path), timeout=300)
    rerun_log = rerun.stdout + rerun.stderr
    assert "state=failed" in rerun_log, rerun_log[-4000:]
    assert "RayBatchRowsFailedError" in rerun_log, rerun_log[-4000:]
    assert f"{rows} of {rows} rows failed" in rerun_log and f"'missing id' {rows}" in rerun_log
    kept = f"Nothing was committed: {output_uri} is as it was (version {manifest['version']} stays current)."
    assert kept in rerun_log, rerun_log[-4000:]
    assert "No row has a value in id_column='Customer Id': is that the input's id column?" in rerun_log
    assert json.loads((Path(output_uri) / "manifest.json").read_text())["version"] == manifest["version"]
    assert len(pq.read_table(manifest["outputs_uri"])) == rows


def test_the_readmes_first_dag_labels_a_days_reviews(airflow_env, tiny_model, tmp_path) -> None:
    """dags/daily_review_sentiment.py, the README's first DAG, as a user runs it: its Params' defaults
    are a GPU's, so the run's conf gives vLLM's CPU build (keep_warm_seconds is the home's policy's)."""
    day, rows = "2026-09-21", 12
    reviews = tmp_path / "reviews" / day / "reviews.jsonl"
    reviews.parent.mkdir(parents=True)
    texts = ["Works as promised.", "Broke after a day.", "Fast delivery, poor fit."]
    reviews.write_text("".join(json.dumps({"text": texts[n % 3]}) + "\n" for n in range(rows)))
    conf = {
        "model": str(tiny_model),
        "data_root": str(tmp_path),
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
    }

    result = airflow_env.dags_test("daily_review_sentiment", run_date(day), conf, timeout=600)

    log = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in log, log[-4000:]
    assert "RayJobTrigger" in log  # deferred
    manifest = airflow_env.xcoms("daily_review_sentiment", run_date(day))[("label_reviews", "manifest")]
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (rows, rows, 0)
    labels = [row["generated_text"] for row in pq.read_table(manifest["outputs_uri"]).to_pylist()]
    assert len(labels) == rows and set(labels) <= {"positive", "negative", "mixed"}, labels
    assert manifest["outputs_uri"].startswith(f"{tmp_path}/review_sentiment/{day}/versions/")


def test_a_date_without_its_input_fails_the_task_naming_it(airflow_env, tiny_model, tmp_path) -> None:
    """A backfill date whose file never arrived: the job fails at its start, before any engine, and the
    task's error names the input (not Ray Data's FileNotFoundError traceback)."""
    day = "2026-11-16"  # no customers.csv written for it
    result = airflow_env.dags_test(DAG_ID, run_date(day), _conf(tiny_model, tmp_path), timeout=300)
    log = result.stdout + result.stderr
    assert "state=failed" in log, log[-4000:]
    missing = tmp_path / "customers" / day / "customers.csv"
    assert f"InputNotFoundError: input_uri='{missing}': no such file or folder" in log, log[-4000:]
    assert "read_binary_files" not in log  # failed at the job's start, not in Ray Data's read
    assert not (tmp_path / "company_industry" / day / "manifest.json").exists()


def test_invalid_parameter_fails_before_anything_is_submitted(airflow_env, tiny_model, tmp_path) -> None:
    conf = {**_conf(tiny_model, tmp_path), "engine_kwargs": {"max_model_len": 0}}
    result = airflow_env.dags_test(DAG_ID, "2026-11-17", conf, timeout=300)
    log = result.stdout + result.stderr
    assert "state=failed" in log, log[-4000:]
    assert "engine_kwargs['max_model_len']=0 must be an int >= 1" in log
    assert "Submitted Ray job" not in log
    assert "XCom not found" not in log  # the "Ray job" link of a task with no job reads none
