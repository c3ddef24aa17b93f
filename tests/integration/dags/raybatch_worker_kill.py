"""Test DAG: the ticket summary, waiting in its worker (not deferred), with one retry.

tests/integration/test_airflow_ui.py kills this task's process while it waits on its Ray job; the
scheduler's retry must attach to that job instead of submitting a second one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator


@dag(
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "model": "",
        "data_root": "",
        "engine_kwargs": {},
        "replica_resources": None,
        "keep_warm_seconds": None,
    },
)
def raybatch_worker_kill() -> None:
    RayLLMBatchOperator(
        task_id="summarise_tickets",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/tickets/{{ ds }}/",
        input_format="jsonl",
        output_uri="{{ params.data_root }}/ticket_summaries/{{ ds }}",
        user_template="Subject: {subject}\n\n{body}\n\nSummary:",
        sampling_params={"temperature": 0, "max_tokens": 48},
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        replica_resources="{{ params.replica_resources | tojson }}",
        keep_warm_seconds="{{ params.keep_warm_seconds }}",
        id_column="ticket_id",
        output_format="jsonl",
        batch_size=8,
        deferrable=False,  # waits in the worker process, which the test kills
        poll_interval_seconds=2,
        retries=1,
        retry_delay=timedelta(seconds=1),
    )


raybatch_worker_kill()
