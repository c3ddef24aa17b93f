"""The OpenAI provider's ``OpenAITriggerBatchOperator`` against this provider's Batch API.

DAGs already written for OpenAI's Batch API run on the Ray cluster by changing one connection: an
``openai`` connection whose host is the Airflow API server's ``/openai/v1`` (the provider's Batch
API plugin, docs/openai-batch-api.md) and whose password is an Airflow API token. Each batch becomes
a run of dags/openai_batch_api.py, which picks the model and engine. The file is uploaded and the
results read with the OpenAI provider's own hook, as a DAG written for OpenAI would.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from typing import Any

# Without Airflow's OpenAI provider (the common-ai extra installs it: pip install
# 'airflow-provider-raybatch[common-ai]') this file defines no DAG, rather than an import error in
# every DAG run's log.
if importlib.util.find_spec("airflow.providers.openai") is not None:
    from airflow.providers.openai.hooks.openai import OpenAIHook
    from airflow.providers.openai.operators.openai import OpenAITriggerBatchOperator
    from airflow.sdk import Param, dag, task

    CONN_ID = "openai_raybatch"
    QUESTIONS = ["What is Apache Airflow?", "What is Ray?", "Name a colour.", "Say hello."]

    @task
    def upload_requests(questions: list[str], params: dict[str, Any] | None = None) -> str:
        """Write OpenAI batch lines (one per question) and upload them as a batch file; returns its id."""
        max_tokens = int((params or {})["max_tokens"])
        lines = [
            {
                "custom_id": f"q-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "any",
                    "messages": [{"role": "user", "content": q}],
                    "max_tokens": max_tokens,
                },
            }
            for i, q in enumerate(questions)
        ]
        # A field our engine cannot honour: this request alone lands in the error file.
        tools = {"model": "any", "messages": [{"role": "user", "content": "Weather?"}], "tools": []}
        lines.append({"custom_id": "q-tools", "method": "POST", "url": "/v1/chat/completions", "body": tools})
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as file:
            file.write("".join(json.dumps(line) + "\n" for line in lines))
        return OpenAIHook(conn_id=CONN_ID).upload_file(file.name, purpose="batch").id

    @task
    def read_answers(batch_id: str) -> dict[str, Any]:
        """The batch's counts, answers and errors by custom_id, read back through the OpenAI client."""
        hook = OpenAIHook(conn_id=CONN_ID)
        batch = hook.get_batch(batch_id)
        text = hook.conn.files.content(batch.output_file_id).text if batch.output_file_id else ""
        answers = {
            line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
            for line in map(json.loads, text.splitlines())
        }
        errors_text = hook.conn.files.content(batch.error_file_id).text if batch.error_file_id else ""
        errors = {line["custom_id"]: line["error"] for line in map(json.loads, errors_text.splitlines())}
        return {
            "status": batch.status,
            "counts": batch.request_counts.model_dump(),
            "answers": answers,
            "errors": errors,
        }

    @dag(
        schedule=None,
        tags=["raybatch", "openai", "example"],
        params={"max_tokens": Param(16, type="integer", description="max_tokens of every request.")},
    )
    def openai_provider_batch() -> None:
        file_id = upload_requests(QUESTIONS)
        deferred = OpenAITriggerBatchOperator(
            task_id="batch_deferred",
            file_id=file_id,
            endpoint="/v1/chat/completions",
            conn_id=CONN_ID,
            metadata={"dag": "openai_provider_batch"},
            deferrable=True,
            poll_interval=5,
        )
        read_answers(deferred.output)
        in_worker = OpenAITriggerBatchOperator(
            task_id="batch_in_worker",
            file_id=file_id,
            endpoint="/v1/chat/completions",
            conn_id=CONN_ID,
            deferrable=False,
            wait_seconds=5,
        )
        deferred >> in_worker
        read_answers.override(task_id="read_answers_in_worker")(in_worker.output)

    openai_provider_batch()
