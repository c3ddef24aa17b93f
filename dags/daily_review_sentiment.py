"""The README's first DAG: each night, label the day's product reviews positive, negative or mixed.

The shortest complete daily DAG: one batch task, whose model, data root and engine settings are Params
(a run's ``--conf`` overrides them). tests/integration/test_dag_runs.py runs it on vLLM's CPU build;
dags/daily_company_industry.py is a fuller one (a task that reads the manifest, keep-warm engines, S3
credentials).
"""

from datetime import datetime

from airflow.sdk import CronDataIntervalTimetable, Param, dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

LABELS = ["positive", "negative", "mixed"]


@dag(
    # The run at midnight reads the day that just ended: its data interval's start.
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "model": Param("Qwen/Qwen2.5-1.5B-Instruct", type="string"),
        "data_root": Param("s3://my-bucket/raybatch", type="string"),
        "engine_kwargs": Param({"max_model_len": 4096}, type="object"),
        "replica_resources": Param(None, type=["null", "object"]),  # unset: one GPU per replica
    },
)
def daily_review_sentiment() -> None:
    RayLLMBatchOperator(
        task_id="label_reviews",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/reviews/{{ data_interval_start | ds }}/reviews.jsonl",
        output_uri="{{ params.data_root }}/review_sentiment/{{ data_interval_start | ds }}",
        user_template="Is this review positive, negative or mixed? {text}",
        sampling_params={"max_tokens": 16, "structured_outputs": {"choice": LABELS}},
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        replica_resources="{{ params.replica_resources | tojson }}",
        deferrable=True,  # wait in the triggerer, not in a worker slot
    )


daily_review_sentiment()
