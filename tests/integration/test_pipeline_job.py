"""The pipeline as a real Ray job on the local cluster with vLLM's CPU engine, on dirty input.

Submitted exactly as the operator submits it (its spec, entrypoint and runtime_env), without Airflow
around it. Every kind of bad row lands in the errors with its reason; good rows finish; counts add up.
Its model is fetched from a real S3-compatible server with the keys of an AWS connection, which are
searched for in every file of the Ray session folder while the job runs.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.manifest import manifest_from_log
from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    S3Server,
    cluster_ray_version,
    engine_plan,
    submit_pipeline,
    wait_for_job,
)
from tests.security.test_job_credentials import DiskWatch, cluster_store, files_holding

# A cold engine of its own: the subject is a job's cold path (its timings, no warm pool) on a model
# fetched from S3 (a model no warm pool holds; its fetch is in the cold path's read_and_prepare_s).
pytestmark = [pytest.mark.integration, pytest.mark.cold_engine, pytest.mark.timeout(900)]

LABELS = ["positive", "negative", "neutral"]
GOOD_ROWS = 40


def _ticket(i: int | str, text: str) -> dict:
    return {
        "ticket_id": f"T{i:03d}" if isinstance(i, int) else i,
        "channel": "email",
        "messages": [
            {"role": "system", "content": "Classify the sentiment of the ticket."},
            {"role": "user", "content": text},
        ],
    }


def write_dirty_corpus(path: Path) -> dict[str, str]:
    """GOOD_ROWS good tickets plus one bad row of each kind; returns {error id: expected reason kind}."""
    lines = [
        json.dumps(_ticket(i, f"Ticket {i}: my order arrived {'late' if i % 2 else 'early'}."))
        for i in range(GOOD_ROWS)
    ]
    bad = [
        '{"ticket_id": "T-broken", "messages": [',  # line 41: malformed JSON
        '["not", "an", "object"]',  # line 42
        json.dumps({"ticket_id": "T-nomsg", "channel": "email"}),  # missing field
        json.dumps({"ticket_id": "T-typed", "messages": 42}),  # wrong type
        json.dumps({"ticket_id": "T-empty", "messages": [{"role": "user", "content": "  "}]}),
        json.dumps(_ticket("T-long", "word " * 2000)),  # longer than max_model_len
        json.dumps(_ticket("T000", "a second ticket with an id seen before")),  # duplicate id, line 47
        json.dumps({"channel": "email", "messages": [{"role": "user", "content": "no id"}]}),  # line 48
    ]
    data = (
        "\n".join(lines + bad) + "\n"
    ).encode() + b'{"ticket_id": "T-utf8", "note": "\xff\xfe"}\n'  # line 49
    path.write_bytes(data)
    return {
        "tickets.jsonl:41": "malformed JSON",
        "tickets.jsonl:42": "not a JSON object",
        "T-nomsg": "bad messages",
        "T-typed": "bad messages",
        "T-empty": "empty prompt",
        "T-long": "inference failed",
        "T000": "duplicate id",
        "tickets.jsonl:48": "missing id",
        "tickets.jsonl:49": "invalid UTF-8",
    }


def make_operator(model: Path | str, input_uri: str, output_uri: str, **overrides) -> RayLLMBatchOperator:
    params = dict(
        task_id="classify",
        model=str(model),
        input_uri=input_uri,
        output_uri=output_uri,
        messages_column="messages",
        id_column="ticket_id",
        keep_columns=["channel"],
        sampling_params={"temperature": 0, "max_tokens": 24, "structured_outputs": {"choice": LABELS}},
        engine_kwargs=CPU_ENGINE_KWARGS,
        replica_resources=CPU_REPLICA,
        batch_size=16,
        max_failed_fraction=0.5,  # the corpus is dirty on purpose: 8 of 49 rows (16%) fail
    )
    return RayLLMBatchOperator(**{**params, **overrides})


def _contract_sample_manifest() -> dict:
    """The sample manifest docs/downstream-contract.md shows (its first JSON block)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "downstream-contract.md").read_text()
    return json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])


def test_dirty_input_lands_in_errors_with_exact_counts(
    ray_connection, s3_server: S3Server, tiny_model, tmp_path, monkeypatch
) -> None:
    input_path = tmp_path / "in" / "tickets.jsonl"
    input_path.parent.mkdir()
    expected_errors = write_dirty_corpus(input_path)
    output_uri = str(tmp_path / "out")
    compile_cache = tmp_path / "compile-cache"
    s3_server.client().create_bucket(Bucket="raybatch-cold-models")
    model_uri = s3_server.upload_tree(tiny_model, "raybatch-cold-models", "tiny-llama")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_MODELS_TEST", s3_server.connection_json())
    from_s3 = {"aws_conn_id": "aws_models_test", "model_cache_dir": str(tmp_path / "models")}
    operator = make_operator(
        model_uri, str(input_path), output_uri, compile_cache_dir=str(compile_cache), **from_s3
    )
    hook = RayHook()
    session = (ray_connection.temp_dir / "session_latest").resolve()  # the fixture's cluster's session
    with DiskWatch(session, s3_server.secret_key) as watch:
        job_id = submit_pipeline(operator, "dirty", f"pipeline-test-{uuid.uuid4().hex[:8]}")
        assert wait_for_job(job_id) == JobStatus.SUCCEEDED, hook.get_job_log_tail(job_id, 80)

    manifest = json.loads(Path(output_uri, "manifest.json").read_text())
    log = hook.get_job_logs(job_id)
    assert manifest == manifest_from_log(log)
    # The model came from S3 (every file fetched once, into the job's cache folder); its keys were in
    # no file of the session folder while it ran, and have left the cluster's store since.
    [fetched] = [line for line in log.splitlines() if f"Model {model_uri} is at " in line]
    assert str(tmp_path / "models") in fetched and "files fetched: [0]" not in fetched, fetched
    assert watch.searches > 0
    assert sorted(watch.hits | set(files_holding(session, s3_server.secret_key))) == []
    store = cluster_store(ray_connection)
    assert (store["copies"], store["uploads"]) == ([], []), store
    assert s3_server.secret_key not in log
    # its bad rows are filtered out before the engine's batches are cut (Ray Data may fuse the filter
    # into the operator before it)
    assert "Filter(" in engine_plan(log).split("StreamingRepartition")[0], engine_plan(log)
    outputs = pq.read_table(manifest["outputs_uri"]).to_pylist()
    errors = pq.read_table(manifest["errors_uri"]).to_pylist()
    # docs/downstream-contract.md's sample manifest has the keys a committed one of a choice has (its
    # table names the others: OpenAI's counts, a held try's cost).
    sample = _contract_sample_manifest()
    assert set(sample) == set(manifest), sorted(set(sample) ^ set(manifest))
    # The version lists its parts (docs/downstream-contract.md), and its folders hold exactly them.
    version = Path(output_uri, "versions", manifest["version"])
    listed = set(json.loads((version / "parts.json").read_text()))
    files = {path.name.split(".", 1)[0] for path in version.glob("*/part-*.parquet")}
    assert files == listed and listed, (files, listed)

    # Good rows: each exactly once (the first T000 is good; its duplicate is an error), with a label.
    assert sorted(row["ticket_id"] for row in outputs) == [f"T{i:03d}" for i in range(GOOD_ROWS)]
    assert set(outputs[0]) == {
        "ticket_id",
        "channel",
        "generated_text",
        "num_input_tokens",
        "num_generated_tokens",
    }
    assert {row["generated_text"] for row in outputs} <= set(LABELS)
    # Bad rows: each with the row's id (or file:line where it has none) and its reason.
    reasons = {row["id"]: row["error"] for row in errors}
    assert len(errors) == len(expected_errors) == len(reasons)
    assert {key: reasons[key].split(":", 1)[0] for key in reasons} == expected_errors
    assert "first seen at tickets.jsonl:1" in reasons["T000"]

    rows_in = GOOD_ROWS + len(expected_errors)
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (rows_in, GOOD_ROWS, 9)
    assert manifest["rows_in"] == manifest["rows_out"] + manifest["rows_failed"]
    assert manifest["rows_duplicate"] == 1
    assert manifest["errors_by_reason"] == dict(Counter(expected_errors.values()))
    assert manifest["tokens_in"] == sum(row["num_input_tokens"] for row in outputs)
    assert manifest["tokens_out"] == sum(row["num_generated_tokens"] for row in outputs)
    assert sum(manifest["generated_text_counts"].values()) == GOOD_ROWS
    assert manifest["spec_fingerprint"] == operator.build_spec().fingerprint()
    # The CPU replica is the job's own layout: the default one (generate/default_layout.py) is not made.
    layout = manifest["layout"]
    assert (layout["replicas_per_gpu"], layout["chosen_by"]) == (None, "the job's settings"), layout
    assert layout["reason"].startswith("set by replica_resources, engine_kwargs['gpu_memory_utilization']")
    assert manifest["versions"]["vllm"] and manifest["versions"]["ray"] == cluster_ray_version()
    # Where the time went (pipeline/reporting/timings.py): every phase measured, none past the wall.
    timings = manifest["timings"]
    phases = (
        "read_and_prepare_s",
        "engine_start_to_first_row_s",
        "engine_import_s",
        "engine_build_s",
        "generating_s",
        "engine_stage_s",
        "commit_s",
    )
    assert all(0 <= timings[phase] <= manifest["wall_seconds"] for phase in phases), timings
    assert timings["engine_start_to_first_row_s"] + timings["generating_s"] <= timings["engine_stage_s"] + 1
    # ...and before the run: the runtime env (from the Jobs API's record) and the driver's own start,
    # which the job's wall (submit to end, as Ray counts it) holds with the run.
    info = hook.get_job_info(job_id)
    assert info.start_time_ms and info.end_time_ms
    job_wall = (info.end_time_ms - info.start_time_ms) / 1000
    before_run = timings["runtime_env_s"] + timings["driver_start_s"]
    assert timings["runtime_env_s"] > 0 and timings["driver_start_s"] > 0 and before_run < job_wall, timings
    assert manifest["wall_seconds"] + before_run <= job_wall + 1, (timings, job_wall)
    # The job's own time in the manifest, submit to commit: Ray's wall less only the manifest's write and
    # the driver's exit (else wall_seconds left out 14 s of a 65.7 s job, unsaid).
    assert manifest["wall_seconds"] + before_run - 1 <= timings["job_wall_s"] <= job_wall + 0.5, (
        timings,
        job_wall,
    )
    assert job_wall - timings["job_wall_s"] < 5, (timings, job_wall)
    # One after the other, the phases make up the job's time (else 10.6 s of a 46.2 s job were in none).
    sequential = (
        "runtime_env_s",
        "driver_start_s",
        "read_and_prepare_s",
        "before_engine_stage_s",
        "engine_start_to_first_row_s",
        "generating_s",
        "engine_stage_end_s",
        "commit_s",
    )
    assert sum(timings[phase] for phase in sequential) == pytest.approx(timings["job_wall_s"], abs=0.05), (
        timings
    )
    # The one CPU replica's start-up, from the clock it stamped on its parts; engine build the slowest.
    [replica] = timings["engine_replicas"]
    assert replica["engine_build_s"] == timings["engine_build_s"] > 0, timings
    assert replica["actor_start_s"] + replica["import_s"] + replica["engine_build_s"] + replica[
        "first_row_s"
    ] == pytest.approx(timings["engine_start_to_first_row_s"], abs=0.01)
    report_page = Path(manifest["report_uri"]).read_text()
    assert "Where the time went" in report_page and replica["replica"] in report_page
    # A CPU engine holds no GPU: replicas x 0 GPUs.
    assert (timings["replicas"], timings["gpus_per_replica"], timings["gpu_seconds_held"]) == (1, 0.0, 0.0)
    assert timings["replica_seconds_held"] == round(timings["engine_stage_s"], 1)  # ...but a replica
    assert timings["keep_warm_gpu_seconds_max"] is None  # no warm pool
    assert not (tmp_path / "out" / "_staging").exists() or not any((tmp_path / "out" / "_staging").iterdir())
    # The replica's vLLM kept its caches under compile_cache_dir (the model inspection it caches even
    # with enforce_eager; torch.compile's graphs and Triton's kernels go there on a GPU).
    assert any((compile_cache / "modelinfos").iterdir())

    # A dry run of the same input at the same output_uri: everything but the engine. It predicts the
    # real run's failures and counts the prompt tokens the engine counted, and commits nothing.
    committed = Path(output_uri, "manifest.json").read_bytes()
    dry = make_operator(model_uri, str(input_path), output_uri, dry_run=True, **from_s3)
    dry_job = submit_pipeline(dry, "dirty", f"pipeline-dry-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(dry_job) == JobStatus.SUCCEEDED, hook.get_job_log_tail(dry_job, 80)
    predicted = json.loads(Path(output_uri, "_dry_runs", "dirty", "manifest.json").read_text())
    assert predicted == manifest_from_log(hook.get_job_logs(dry_job))
    assert Path(output_uri, "manifest.json").read_bytes() == committed  # the committed version untouched
    assert (predicted["status"], predicted["dry_run"], predicted["job_id"]) == ("dry_run", True, dry_job)
    assert (predicted["rows_in"], predicted["rows_out"], predicted["rows_failed"]) == (rows_in, GOOD_ROWS, 9)
    # The engine's "inference failed" of the over-long ticket is predicted as what it is.
    expected_reasons = Counter(expected_errors.values())
    expected_reasons["prompt too long"] = expected_reasons.pop("inference failed")
    assert predicted["errors_by_reason"] == dict(sorted(expected_reasons.items()))
    assert predicted["rows_duplicate"] == 1
    # the chat template and tokenizer the engine used
    assert predicted["prompt_tokens"] == manifest["tokens_in"]
    assert sum(bucket["rows"] for bucket in predicted["prompt_tokens_histogram"]) == GOOD_ROWS
    assert predicted["output_tokens_at_most"] == GOOD_ROWS * 24
    # The last run's rate while generating, and its start-up once (not its rows over its wall time,
    # which is mostly start-up on a short run).
    # The rate is of the rows the run's engines generated: the good rows and the over-long ticket,
    # which the engine failed (the rows a try resumes are not: tests/unit/pipeline/test_dry_run_rate.py).
    timings = manifest["timings"]
    assert timings["rows_generated"] == GOOD_ROWS + 1, timings
    rate = timings["rows_generated"] / timings["generating_s"]
    assert predicted["rows_per_second_from"] == "last run, while generating"
    assert predicted["rows_per_second"] == round(rate, 3)
    assert predicted["estimated_startup_seconds"] == round(timings["engine_start_to_first_row_s"], 1)
    assert predicted["estimated_engine_seconds"] == math.ceil(
        timings["engine_start_to_first_row_s"] + GOOD_ROWS / rate
    )
    assert predicted["estimated_gpu_seconds"] == 0  # the CPU engine holds no GPU
    assert "Dry run" in Path(output_uri, "_dry_runs", "dirty", "report.html").read_text()

    # An engine setting misspelled: the job fails at its start, naming it, before any replica starts
    # (every replica used to die in its constructor and be restarted, for minutes).
    typo = make_operator(
        tiny_model, str(input_path), output_uri, engine_kwargs={**CPU_ENGINE_KWARGS, "max_model_length": 512}
    )
    typo_job = submit_pipeline(typo, "typo", f"pipeline-typo-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(typo_job, timeout=300) == JobStatus.FAILED
    typo_log = hook.get_job_logs(typo_job)
    assert "engine_kwargs['max_model_length'] (did you mean 'max_model_len'?)" in typo_log, typo_log[-3000:]
    assert "UnknownEngineArgumentError" in typo_log and "RaybatchvLLMEngineStageUDF" not in typo_log
    assert Path(output_uri, "manifest.json").read_bytes() == committed  # nothing committed

    # A re-run of the date with a wrong id column: every row fails. It must not replace the good version
    # (it would commit 0 rows and delete the date's good version). It is held: the job
    # fails with one clear line, manifest.json and the good version stay, its rows stay staged.
    wrong = make_operator(tiny_model, str(input_path), output_uri, id_column="ticket-id")
    held_job = submit_pipeline(wrong, "rerun", f"pipeline-held-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(held_job, timeout=300) == JobStatus.FAILED
    held_log = hook.get_job_logs(held_job)
    held = manifest_from_log(held_log)
    assert held is not None, held_log[-3000:]
    assert (held["status"], held["current_version"], held["rows_out"]) == ("held", manifest["version"], 0)
    assert (
        held["rows_failed"] == rows_in and held["errors_by_reason"]["missing id"] == rows_in - 3
    )  # 3 unparsed
    assert Path(output_uri, "manifest.json").read_bytes() == committed
    assert sorted(row["ticket_id"] for row in pq.read_table(manifest["outputs_uri"]).to_pylist())[:1] == [
        "T000"
    ]
    assert (
        f"Nothing was committed: {output_uri} is as it was (version {manifest['version']} stays current)"
        in (held_log)
    )
    assert "Traceback" not in held_log, held_log[-3000:]
    assert "No row has a value in id_column='ticket-id': is that the input's id column?" in held_log
    assert Path(output_uri, "_staging", "rerun", "held.json").exists()
    assert len(pq.read_table(held["errors_uri"])) == rows_in  # kept for a look
    # A retry that does not loosen the thresholds (an automatic one) would generate, pay for and hold
    # the same rows again: it is held again at once on the rows it holds, starting no engine.
    again = submit_pipeline(wrong, "rerun", f"pipeline-held-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(again, timeout=300) == JobStatus.FAILED
    again_log = hook.get_job_logs(again)
    assert "the thresholds still fail them: holding them again without generating anything" in again_log, (
        again_log[-3000:]
    )
    assert "EngineStage" not in again_log and "to do." not in again_log  # nothing read or generated
    held_again = manifest_from_log(again_log)
    assert (held_again["status"], held_again["version"], held_again["job_id"]) == (
        "held",
        held["version"],
        again,
    )
    # What generating the rows took is the held try's, not this job's: it started no engine.
    assert held_again["timings"] is None and held_again["held_try"]["job_id"] == held["job_id"]
    assert len(pq.read_table(held["errors_uri"])) == rows_in  # still kept
    assert Path(output_uri, "manifest.json").read_bytes() == committed
