"""Daily: caption the day's images with an open-weights vision-language model on a Ray cluster.

Reads the day's images (Parquet with an ``image_id`` column and an ``image`` column: the
``{"bytes": ..., "path": ...}`` struct that Hugging Face image datasets write, or a path or URL per
row), asks the model for a one-sentence caption of each, and writes the captions as Parquet beside
the input: ``image_id``, the other input columns, ``generated_text`` and token counts, never the
image bytes. An image that is missing, corrupt, truncated or too small is an error row with its
reason, not a failed task; the task log and the run report count them.

Copy it and change the params' defaults to your model, bucket and cluster; the tests override them
with ``airflow dags test ... --conf`` to run a tiny local vision-language model on vLLM's CPU build.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import CronDataIntervalTimetable, Param, dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator


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
    tags=["raybatch", "llm", "vision", "example"],
    params={
        "model": Param(
            "HuggingFaceTB/SmolVLM-256M-Instruct",
            type="string",
            description="HF id or path of a vision-language model.",
        ),
        "data_root": Param(
            "s3://my-bucket/raybatch", type="string", description="Root of inputs and outputs."
        ),
        "engine_kwargs": Param(
            {"max_model_len": 4096, "limit_mm_per_prompt": {"image": 1}},
            type="object",
            description="vLLM engine arguments.",
        ),
        "image_max_side": Param(
            512,
            type=["null", "integer"],
            description="Shrink images to this longest side (bounds the vision tokens per image).",
        ),
        "replica_resources": Param(
            None,
            type=["null", "object"],
            description="Resources per replica; {'CPU': 1} on vLLM's CPU build.",
        ),
        "aws_conn_id": Param(None, type=["null", "string"], description="AWS connection for s3:// data."),
        "max_failed_fraction": Param(
            0.1,
            type="number",
            description="Fail the task when more than this share of the images failed (corrupt, missing, "
            "too small); such a run commits nothing and its rows are held for a retry with a looser "
            "fraction.",
        ),
    },
)
def daily_image_captions() -> None:
    RayLLMBatchOperator(
        task_id="caption_images",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/images/{{ data_interval_start | ds }}/",
        input_format="parquet",
        output_uri="{{ params.data_root }}/image_captions/{{ data_interval_start | ds }}",
        system_prompt="You write short, factual image captions.",
        user_template="Describe this image in one sentence.",
        image_column="image",
        image_max_side="{{ params.image_max_side }}",
        id_column="image_id",
        sampling_params={"temperature": 0, "max_tokens": 48},
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        replica_resources="{{ params.replica_resources | tojson }}",
        output_format="parquet",
        batch_size=16,
        aws_conn_id="{{ params.aws_conn_id or '' }}",
        progress_interval_seconds=20,
        max_failed_fraction="{{ params.max_failed_fraction }}",
        # Wait in the triggerer, not a worker slot, whatever [operators] default_deferrable says.
        deferrable=True,
    )


daily_image_captions()
