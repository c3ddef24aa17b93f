"""Daily: summarise yesterday's support tickets with an open-weights LLM; tell downstream DAGs.

Reads the day's tickets (JSONL: ``ticket_id``, ``subject``, ``body``), asks the model for a
one-sentence summary of each (free text), writes them beside the input, and emits an event on the
``support_ticket_summaries`` Asset, whose extras carry the day's output location and counts.
``dags/support_summary_digest.py`` is scheduled on that Asset.

Copy it and change the params' defaults to your model, bucket and cluster; the tests override them
with ``airflow dags test ... --conf`` to run a tiny local model on vLLM's CPU build.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Asset, CronDataIntervalTimetable, Param, dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

#: The Asset downstream DAGs schedule on; each event's extras name the day's output.
SUPPORT_TICKET_SUMMARIES = Asset(
    name="support_ticket_summaries", uri="s3://my-bucket/raybatch/support_ticket_summaries"
)


@dag(
    # Each run reads the day in its data interval (``data_interval_start``): the run that starts at
    # midnight covers the day that just ended. (Airflow 3's plain "@daily" is a cron
    # trigger whose interval is the run's own instant: ``{{ ds }}`` would be the day just
    # starting.) A backfill's dates are the days read; a manual run (the UI's trigger, or
    # ``airflow dags test <dag> 2026-11-21``) reads the day before its date (2026-11-20).
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["raybatch", "llm", "example"],
    params={
        "model": Param(
            "Qwen/Qwen2.5-1.5B-Instruct", type="string", description="HF id or path of the model."
        ),
        "data_root": Param(
            "s3://my-bucket/raybatch", type="string", description="Root of inputs and outputs."
        ),
        "engine_kwargs": Param({"max_model_len": 4096}, type="object", description="vLLM engine arguments."),
        "replica_resources": Param(
            None,
            type=["null", "object"],
            description="Resources per replica; {'CPU': 1} on vLLM's CPU build.",
        ),
        "aws_conn_id": Param(None, type=["null", "string"], description="AWS connection for s3:// data."),
        "keep_warm_seconds": Param(
            None,
            type=["null", "number"],
            description="Keep the engines warm this long for the next date (a backfill pays the engine "
            "start-up once; docs/warm-engines.md); unset: each run starts and stops its own.",
        ),
    },
)
def daily_support_ticket_summary() -> None:
    RayLLMBatchOperator(
        task_id="summarise_tickets",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/tickets/{{ data_interval_start | ds }}/",
        input_format="jsonl",
        output_uri="{{ params.data_root }}/ticket_summaries/{{ data_interval_start | ds }}",
        system_prompt="You summarise customer support tickets in one short sentence.",
        user_template="Subject: {subject}\n\n{body}\n\nSummary:",
        sampling_params={"temperature": 0, "max_tokens": 48},
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        replica_resources="{{ params.replica_resources | tojson }}",
        id_column="ticket_id",
        keep_columns=["subject"],
        output_format="jsonl",
        batch_size=32,
        aws_conn_id="{{ params.aws_conn_id or '' }}",
        keep_warm_seconds="{{ params.keep_warm_seconds }}",
        output_asset=SUPPORT_TICKET_SUMMARIES,
        progress_interval_seconds=20,
        # Wait in the triggerer, not a worker slot, whatever [operators] default_deferrable says.
        deferrable=True,
    )


daily_support_ticket_summary()
