"""Daily: infer each new customer's company industry with an open-weights LLM on a Ray cluster.

Every morning this DAG reads yesterday's customers CSV, asks the model for each company's industry
(output constrained to a fixed list of labels with vLLM's structured outputs), writes the labelled
rows beside the input, and logs the count per industry.

Copy it and change the params' defaults to your model, bucket and cluster. The embedded demo
(README) overrides them with ``airflow dags test ... --conf`` to run a tiny local model on vLLM's
CPU build.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow.sdk import CronDataIntervalTimetable, Param, XComArg, dag, task

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

log = logging.getLogger(__name__)

INDUSTRIES = [
    "Law Firm",
    "Healthcare",
    "Technology",
    "Retail",
    "Consulting",
    "Manufacturing",
    "Finance",
    "Real Estate",
    "Other",
]


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
        "keep_warm_seconds": Param(
            None,
            type=["null", "number"],
            description="Keep the engines warm this long for the next date or DAG on this model "
            "(docs/warm-engines.md); unset: each run starts and stops its own.",
        ),
        "aws_conn_id": Param(
            None,
            type=["null", "string"],
            description="AWS connection for s3:// data and model; unset: the Ray cluster's own role.",
        ),
        "reuse_earlier_result": Param(
            True,
            type="boolean",
            description="A clear or backfill of a date takes its earlier succeeded result; false: run "
            "it again (late or corrected input), e.g. --dag-run-conf '{\"reuse_earlier_result\": false}'.",
        ),
    },
)
def daily_company_industry() -> None:
    classify = RayLLMBatchOperator(
        task_id="classify_industry",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/customers/{{ data_interval_start | ds }}/customers.csv",
        output_uri="{{ params.data_root }}/company_industry/{{ data_interval_start | ds }}",
        system_prompt="You classify companies by industry. Answer with the label only.",
        user_template="What industry is this company in: {Company}",
        sampling_params={"temperature": 0, "max_tokens": 16, "structured_outputs": {"choice": INDUSTRIES}},
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        replica_resources="{{ params.replica_resources | tojson }}",
        id_column="Customer Id",
        keep_columns=["Company", "Country"],
        batch_size=64,
        aws_conn_id="{{ params.aws_conn_id or '' }}",
        keep_warm_seconds="{{ params.keep_warm_seconds }}",
        reuse_earlier_result="{{ params.reuse_earlier_result }}",
        # Wait in the triggerer, not a worker slot, whatever [operators] default_deferrable says.
        deferrable=True,
    )

    @task(multiple_outputs=False)
    def log_industry_counts(manifest: dict[str, Any]) -> dict[str, int]:
        """Log how many customers fell into each industry, largest first."""
        counts: dict[str, int] = manifest.get("generated_text_counts", {})
        log.info("%d customers classified (%d failed):", manifest["rows_out"], manifest["rows_failed"])
        for industry, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            log.info("industry %-14s %5d", industry, count)
        return counts

    log_industry_counts(XComArg(classify, key="manifest"))


daily_company_industry()
