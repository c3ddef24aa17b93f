"""Test DAG: Ray Data LLM's public example row functions (ray_data_llm_examples.py), pasted unchanged,
on a drift corpus (tests/integration/test_row_contract.py writes it) and on images.

Three tasks, each a Ray job on the CPU engine: the company-industry pair with a per-row ``choice``
constraint, the quickstart's haiku pair with ``**row``, and the vision pair on the tiny VLM.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

COMMON = dict(
    replica_resources="{{ params.replica_resources | tojson }}",
    batch_size=16,
    max_failed_fraction=0.5,  # the corpus is dirty on purpose; the test counts every reason
    poll_interval_seconds=2,
    deferrable=True,  # the path the example DAGs take
)


@dag(
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params={
        "model": "",
        "vlm": "",
        "data_root": "",
        "engine_kwargs": {},
        "vlm_engine_kwargs": {},
        "replica_resources": None,
    },
)
def raybatch_notebook_rows() -> None:
    RayLLMBatchOperator(
        task_id="industry",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/drift/companies.jsonl",
        output_uri="{{ params.data_root }}/out/industry",
        id_column="Customer Id",
        preprocess="ray_data_llm_examples.industry_preprocess",
        postprocess="ray_data_llm_examples.industry_postprocess",
        sampling_params={"max_tokens": 2},  # the row's own (8, with the choice) must win
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        **COMMON,
    )
    RayLLMBatchOperator(
        task_id="haiku",
        model="{{ params.model }}",
        input_uri="{{ params.data_root }}/drift/items.jsonl",
        output_uri="{{ params.data_root }}/out/haiku",
        preprocess="ray_data_llm_examples.haiku_preprocess",
        postprocess="ray_data_llm_examples.haiku_postprocess",
        engine_kwargs="{{ params.engine_kwargs | tojson }}",
        **COMMON,
    )
    RayLLMBatchOperator(
        task_id="vision",
        model="{{ params.vlm }}",
        input_uri="{{ params.data_root }}/images/images.jsonl",
        output_uri="{{ params.data_root }}/out/vision",
        preprocess="ray_data_llm_examples.vision_preprocess",
        postprocess="ray_data_llm_examples.vision_postprocess",
        engine_kwargs="{{ params.vlm_engine_kwargs | tojson }}",
        **COMMON,
    )


raybatch_notebook_rows()
