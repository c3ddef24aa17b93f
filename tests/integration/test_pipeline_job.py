"""The pipeline as a real Ray job on the local cluster with vLLM's CPU engine.

Submitted exactly as the operator submits it (its spec, entrypoint and runtime_env), without Airflow
around it, on JSONL input whose rows carry chat messages, some of them bad.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.manifest import manifest_from_log
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from tests.integration.conftest import CPU_ENGINE_KWARGS, CPU_REPLICA

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

LABELS = ["positive", "negative", "neutral"]
GOOD_ROWS = 40


def _write_input(path: Path) -> dict[str, str]:
    """GOOD_ROWS good tickets plus one bad row of each kind; returns {source or id: expected reason}."""
    lines = [
        json.dumps({"ticket_id": f"T{i:03d}", "channel": "email", "messages": [
            {"role": "system", "content": "Classify the sentiment of the ticket."},
            {"role": "user", "content": f"Ticket {i}: my order arrived {'late' if i % 2 else 'early'}."},
        ]})
        for i in range(GOOD_ROWS)
    ]  # fmt: skip
    lines.insert(5, '{"ticket_id": "T-broken", "messages": [')  # malformed JSON, line 6
    lines.append(json.dumps({"ticket_id": "T-empty", "messages": []}))
    lines.append(json.dumps({"ticket_id": "T-long", "messages": [{"role": "user", "content": "word " * 2000}]}))
    path.write_text("\n".join(lines) + "\n")
    return {
        "tickets.jsonl:6": "malformed JSON on line 6",
        "T-empty": "must hold a non-empty list of chat messages",
        "T-long": "inference failed",
    }


def test_pipeline_job_writes_every_row_once_with_a_choice_label(ray_connection, tiny_model, tmp_path) -> None:
    input_path = tmp_path / "in" / "tickets.jsonl"
    input_path.parent.mkdir()
    expected_errors = _write_input(input_path)
    output_uri = str(tmp_path / "out")
    operator = RayLLMBatchOperator(
        task_id="classify",
        model=str(tiny_model),
        input_uri=str(input_path),
        output_uri=output_uri,
        messages_column="messages",
        id_column="ticket_id",
        keep_columns=["channel"],
        sampling_params={"temperature": 0, "max_tokens": 24, "structured_outputs": {"choice": LABELS}},
        engine_kwargs=CPU_ENGINE_KWARGS,
        replica_resources=CPU_REPLICA,
        batch_size=16,
    )
    spec = operator.build_spec()
    hook = RayHook()
    job_id = hook.submit_job(
        operator.entrypoint(spec),
        submission_id=f"pipeline-test-{uuid.uuid4().hex[:8]}",
        runtime_env=operator._runtime_env(hook, spec),
    )
    deadline = time.monotonic() + 840
    while not (status := hook.get_job_status(job_id)).is_terminal and time.monotonic() < deadline:
        time.sleep(2)
    assert status == JobStatus.SUCCEEDED, hook.get_job_log_tail(job_id, 80)

    outputs = pq.read_table(f"{output_uri}/outputs").to_pylist()
    errors = pq.read_table(f"{output_uri}/errors").to_pylist()
    assert sorted(row["ticket_id"] for row in outputs) == [f"T{i:03d}" for i in range(GOOD_ROWS)]
    assert set(outputs[0]) == {"ticket_id", "channel", "generated_text", "num_input_tokens", "num_generated_tokens"}
    assert {row["generated_text"] for row in outputs} <= set(LABELS)
    assert all(row["channel"] == "email" and row["num_input_tokens"] > 0 for row in outputs)
    reasons = {row["id"]: row["error"] for row in errors}
    assert sorted(reasons) == sorted(expected_errors)
    for key, reason in expected_errors.items():
        assert reason in reasons[key], reasons[key]

    manifest = json.loads(Path(output_uri, "manifest.json").read_text())
    assert manifest == manifest_from_log(hook.get_job_logs(job_id))
    assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (GOOD_ROWS + 3, GOOD_ROWS, 3)
    assert manifest["tokens_in"] == sum(row["num_input_tokens"] for row in outputs)
    assert manifest["tokens_out"] == sum(row["num_generated_tokens"] for row in outputs)
    assert sum(manifest["generated_text_counts"].values()) == GOOD_ROWS
    assert sum(manifest["errors_by_reason"].values()) == 3
    assert manifest["spec_fingerprint"] == spec.fingerprint()
    assert manifest["versions"]["vllm"] and manifest["versions"]["ray"] == "2.60.0"
