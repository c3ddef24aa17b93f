"""Serve OpenAI batches: the DAG behind the provider's OpenAI-compatible Batch API.

With this DAG in your DAGs folder, the Airflow API server answers OpenAI's ``/v1/files`` and
``/v1/batches`` under ``/openai/v1`` (see ``docs/openai-batch-api.md``), and each batch created there
is one run of this DAG. Which model serves the batches, and how, is set here; the tests point the
Airflow Variables below at a tiny local model on vLLM's CPU build.
"""

from __future__ import annotations

from airflow_provider_raybatch.openai_api.dag import openai_batch_dag

openai_batch_dag(
    model="{{ var.value.get('raybatch_openai_model', 'Qwen/Qwen2.5-1.5B-Instruct') }}",
    engine_kwargs="{{ var.value.get('raybatch_openai_engine_kwargs', '{\"max_model_len\": 4096}') }}",
    replica_resources="{{ var.value.get('raybatch_openai_replica_resources', 'null') }}",
    ray_conn_id="ray_default",
    progress_interval_seconds=30,
    # A batch may take its whole completion window: wait in the triggerer, not a worker slot,
    # whatever [operators] default_deferrable says.
    deferrable=True,
)
