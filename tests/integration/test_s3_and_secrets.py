"""S3 end to end (input and output on a real S3-compatible server) and the leak tests.

The example DAG runs through real Airflow with the Ray token in the ``ray`` connection and an S3
secret key in an AWS connection; afterwards both are searched for everywhere they could have
leaked: the task logs, Airflow's whole metadata DB (XComs, rendered template fields, trigger
arguments), the Ray dashboard's job info and driver logs, and, during and after the job, every file
of the Ray session folder and the cluster's key-value store (the job's copy is gone once it ends).
A job whose spec is over 128 KiB (a JSON schema with a long labelling guide), on a model named by a
Hugging Face id, reaches the cluster whole.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.shared.job_settings import POOL_SCOPE_ENV
from tests.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA, POOL_SCOPE, ROOT, S3Server, run_date, warm_conf
from tests.security.test_job_credentials import DiskWatch, cluster_store, files_holding

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "dags"))
from daily_company_industry import INDUSTRIES  # noqa: E402
from make_sample_customers import write_customers_csv  # noqa: E402

DAG_ID = "daily_company_industry"
AWS_CONN_ID = "aws_s3_test"


def _objects(s3: S3Server, bucket: str, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _read_parquet_rows(s3: S3Server, uri: str) -> list[dict]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    rows: list[dict] = []
    for key in _objects(s3, bucket, prefix + "/"):
        if key.endswith(".parquet"):
            body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
            rows += pq.read_table(io.BytesIO(body)).to_pylist()
    return rows


def _ray_job_views(hook, job_id: str) -> dict[str, str]:
    """Everything the Ray dashboard shows of a job: the job list, its details and its driver log."""
    return {
        "GET /api/jobs/": hook._send(hook_request("GET", "/api/jobs/")).text,
        f"GET /api/jobs/{job_id}": hook._send(hook_request("GET", f"/api/jobs/{job_id}")).text,
        f"GET /api/jobs/{job_id}/logs": hook.get_job_logs(job_id),
    }


def hook_request(method: str, path: str):
    from airflow_provider_raybatch.hooks.ray import _Request

    return _Request(method, path)


def _airflow_db_dump(home: Path) -> str:
    with sqlite3.connect(home / "airflow.db") as db:
        return "\n".join(db.iterdump())


# On the session's warm engines: the subject is S3 and the keys, not the model (a model fetched from S3
# is test_pipeline_job's, whose cold engine it is).
def test_s3_run_commits_on_s3_and_leaks_no_secret(
    airflow_env, ray_connection, s3_server: S3Server, tiny_model: Path, tmp_path: Path
) -> None:
    from airflow_provider_raybatch.hooks.ray import RayHook

    day, rows = "2026-11-16", 60
    client = s3_server.client()
    client.create_bucket(Bucket="raybatch-data")
    local_csv = tmp_path / "customers.csv"
    write_customers_csv(local_csv, day, rows)
    client.upload_file(str(local_csv), "raybatch-data", f"customers/{day}/customers.csv")

    env = airflow_env.with_env(**{f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}": s3_server.connection_json()})
    conf = {
        "model": str(tiny_model),
        "data_root": "s3://raybatch-data",
        "engine_kwargs": CPU_ENGINE_KWARGS,
        "replica_resources": CPU_REPLICA,
        "aws_conn_id": AWS_CONN_ID,
        **warm_conf(),
    }
    session = (ray_connection.temp_dir / "session_latest").resolve()  # the fixture's cluster's session
    with DiskWatch(session, s3_server.secret_key) as watch:
        result = env.dags_test(DAG_ID, run_date(day), conf)
    task_log = result.stdout + result.stderr
    assert result.returncode == 0, task_log[-4000:]
    assert "state=success" in task_log, task_log[-4000:]

    # -- the run: read from S3, committed on S3 --------------------------------------------------
    xcoms = env.xcoms(DAG_ID, run_date(day))
    manifest = xcoms[("classify_industry", "manifest")]
    output_uri = f"s3://raybatch-data/company_industry/{day}"
    assert xcoms[("classify_industry", "return_value")] == output_uri
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (rows, rows, 0)
    outputs = _read_parquet_rows(s3_server, manifest["outputs_uri"])
    assert len(outputs) == rows
    assert len({row["Customer Id"] for row in outputs}) == rows
    assert {row["generated_text"] for row in outputs} <= set(INDUSTRIES)
    committed = json.loads(
        client.get_object(Bucket="raybatch-data", Key=f"company_industry/{day}/manifest.json")["Body"].read()
    )
    assert committed["version"] == manifest["version"]
    staged = _objects(s3_server, "raybatch-data", f"company_industry/{day}/_staging/")
    assert [
        key for key in staged if not key.endswith("/")
    ] == []  # moved out (pyarrow may leave a folder marker)

    # -- the leak tests ----------------------------------------------------------------------
    job_id = str(xcoms[("classify_industry", "job_id")])
    hook = RayHook()
    views = {
        "task log (airflow dags test output)": task_log,
        "Airflow metadata DB (xcom, rendered_task_instance_fields, trigger, ...)": _airflow_db_dump(env.home),
        **{f"Ray dashboard {name}": text for name, text in _ray_job_views(hook, job_id).items()},
    }
    for path in sorted((env.home / "logs").rglob("*")) if (env.home / "logs").exists() else []:
        if path.is_file():
            views[f"log file {path.relative_to(env.home)}"] = path.read_text(errors="replace")
    # The searches look where they should: the run's rendered fields and XComs are in the dump.
    dump = views["Airflow metadata DB (xcom, rendered_task_instance_fields, trigger, ...)"]
    assert "rendered_task_instance_fields" in dump and output_uri in dump
    job_view = views[f"Ray dashboard GET /api/jobs/{job_id}"]
    assert f"--spec-fingerprint {manifest['spec_fingerprint']}" in job_view  # the entrypoint names the spec
    secrets = {"Ray token": ray_connection.token, "S3 secret key": s3_server.secret_key}
    leaks = [
        f"{secret} in {where}"
        for secret, value in secrets.items()
        for where, text in views.items()
        if value in text
    ]
    assert leaks == [], leaks

    # The job's code and spec are the only packages its nodes unpacked; the settings were in none.
    runtime_env = json.loads(views[f"Ray dashboard GET /api/jobs/{job_id}"])["runtime_env"]
    assert len([uri for uri in runtime_env["py_modules"] if uri.startswith("gcs://")]) == 2, runtime_env
    assert runtime_env["env_vars"] == {POOL_SCOPE_ENV: POOL_SCOPE}  # the pool scope alone: no key

    # -- the cluster: the key was never in a file of the session folder, and has left the store ----
    store = cluster_store(ray_connection)
    assert Path(store["session_dir"]) == session
    assert watch.searches > 0
    assert sorted(watch.hits | set(files_holding(session, s3_server.secret_key))) == []
    assert (store["copies"], store["uploads"]) == ([], []), store


def _seed_hub_cache(model: Path, hf_home: Path, repo_id: str) -> None:
    """Lay a local model out as the Hugging Face cache does, so a hub id resolves with no network."""
    revision = "0" * 40
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


def _labelling_guide(size: int) -> str:
    """A long labelling guide, as teams put in a JSON schema's description; about ``size`` bytes."""
    rule = "Rule {0}: a ticket mentioning case {0:06d} is neutral unless it says otherwise."
    return "\n".join(rule.format(i) for i in range(size // 70))


def test_model_from_a_hugging_face_id_with_a_spec_over_128_kib(
    ray_connection, tiny_model: Path, tmp_path: Path
) -> None:
    """A Hugging Face id resolved from the hub cache, and a spec far past the 128 KiB that one ``sh -c``
    argument may hold (the spec ships in the job package, not in the entrypoint).

    A dry run: the id reaches the cluster unchanged (pipeline/generate/models.py hands it to vLLM as
    given), and the dry run loads the tokenizer and chat template from it in the hub cache, the
    lookup vLLM makes; no engine is built for a model no other test shares."""
    from tests.conftest import submit_pipeline, wait_for_job
    from tests.integration.test_pipeline_job import LABELS, make_operator

    repo_id = "raybatch-tests/tiny-llama"
    _seed_hub_cache(tiny_model, tmp_path / "hf", repo_id)
    source = tmp_path / "tickets.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": f"ticket {i}"}) + "\n" for i in range(12)))
    schema = {"type": "string", "enum": LABELS, "description": _labelling_guide(300 * 1024)}
    operator = make_operator(
        repo_id,
        str(source),
        str(tmp_path / "out"),
        messages_column=None,
        user_template="Classify: {text}",
        id_column="id",
        keep_columns=None,
        sampling_params={
            "temperature": 0,
            "max_tokens": 32,
            "structured_outputs": {"json": schema, "disable_any_whitespace": True},
        },
        runtime_env={"env_vars": {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}},
        dry_run=True,
    )
    spec = operator.build_spec(run_key="hf-id")
    assert len(spec.model_dump_json()) > 300 * 1024 and len(operator.entrypoint(spec)) < 1024

    job_id = submit_pipeline(operator, run_key="hf-id", submission_id="raybatch-test-hf-id")
    status = wait_for_job(job_id)

    from airflow_provider_raybatch.hooks.ray import RayHook
    from airflow_provider_raybatch.shared.manifest import manifest_from_log

    log = RayHook().get_job_logs(job_id)
    assert status.value == "SUCCEEDED", log[-3000:]
    manifest = manifest_from_log(log)
    assert manifest is not None and manifest["dry_run"] is True and manifest["model"] == repo_id
    # Every prompt tokenized with the tokenizer found under the id in the hub cache.
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (12, 12, 0)
    assert manifest["prompt_tokens"] > 12
    # The spec reached the cluster whole, schema and all: the job's fingerprint of it is the task's.
    assert manifest["spec_fingerprint"] == spec.fingerprint()
