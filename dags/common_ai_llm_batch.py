"""Airflow's own LLM batch tooling on our Ray cluster: common.ai's ``@task.llm_batch`` and
``LLMBatchOperator`` with ``model_id="raybatch:<model>"``.

Two DAGs, each the shape of common.ai's own example (product reviews in, results JSONL and an XCom
manifest out), run as this provider's Ray job: our pipeline, our exactly-once commit, our engine
settings. The ``ray`` connection must carry the dashboard's full address in its host
(``http://ray-head:8265``, port field empty) and the cluster token in its password: common.ai hands
adapters those two fields only (docs/common-ai-llm-batch.md). Engine settings go in
``request_params["raybatch"]``; every other key of ``request_params`` goes into each request's body,
as with OpenAI. The tests override the params with a tiny local model on vLLM's CPU build.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Literal

# Without the common-ai extra (pip install 'airflow-provider-raybatch[common-ai]') this file defines no DAG,
# rather than an import error in every DAG run's log.
if (
    importlib.util.find_spec("airflow.providers.common") is not None
    and importlib.util.find_spec("airflow.providers.common.ai") is not None
):
    from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator
    from airflow.sdk import ObjectStoragePath, Param, dag, task

    REVIEWS = [
        "Absolutely loved it, would buy again.",
        "Broke after one use, very disappointed.",
        "Does what it says on the box. Nothing special.",
        "Shipping took three weeks but the product itself is great.",
    ]

    PARAMS = {
        "model": Param(
            "Qwen/Qwen2.5-1.5B-Instruct", type="string", description="HF id or path of the model."
        ),
        "result_root": Param(
            "s3://my-bucket/llm-batch", type="string", description="Where results land (local path or s3://)."
        ),
        "engine_kwargs": Param({"max_model_len": 4096}, type="object", description="vLLM engine arguments."),
        "replica_resources": Param(
            None,
            type=["null", "object"],
            description="Resources per replica; {'CPU': 1} on vLLM's CPU build.",
        ),
    }
    #: The Ray job's settings, templated from the params (JSON text: common.ai renders them to text).
    RAYBATCH = {
        "engine_kwargs": "{{ params.engine_kwargs | tojson }}",
        "replica_resources": "{{ params.replica_resources | tojson }}",
    }
    #: One folder per DAG run, so a retry or clear of the run re-attaches to its batch (common.ai's rule).
    RESULT_PATH = "{{ params.result_root }}/{{ dag.dag_id }}/{{ run_id }}"

    @task
    def summarize_manifest(manifest: dict[str, Any]) -> dict[str, int]:
        """Read the landed rows back, as common.ai's example does; the XCom value is only the manifest."""
        rows = [
            json.loads(line)
            for line in ObjectStoragePath(manifest["result_uri"]).read_text().splitlines()
            if line
        ]
        by_status: dict[str, int] = {}
        for row in rows:
            by_status[row["status"]] = by_status.get(row["status"], 0) + 1
            if row["status"] != "success":
                print(f"request {row['index']} -> {row['status']}: {row['error'] or row['raw_output']}")
        return by_status

    @dag(schedule=None, tags=["raybatch", "common-ai", "example"], params=PARAMS)
    def common_ai_llm_batch() -> None:
        """``@task.llm_batch``: the function returns the prompts; one request overrides its params."""

        @task.llm_batch(
            llm_conn_id="ray_default",
            model_id="raybatch:{{ params.model }}",
            result_path=f"{RESULT_PATH}/summaries",
            system_prompt="Summarize the review in one short sentence.",
            max_tokens=24,
            request_params={"temperature": 0, "raybatch": RAYBATCH},
            poll_interval=30,
            deferrable=True,
        )
        def build_summary_requests(reviews: list[str]) -> list[Any]:
            return [
                *[f"Review: {review!r}" for review in reviews],
                {"prompt": f"Review: {reviews[0]!r}", "system_prompt": "Answer in French.", "max_tokens": 8},
                # Not a parameter our engine has: this request fails alone (an "errored" row), the rest run.
                {"prompt": f"Review: {reviews[1]!r}", "params": {"reasoning_effort": "low"}},
            ]

        summarize_manifest(build_summary_requests(REVIEWS))

    common_ai_llm_batch()

    @dag(schedule=None, tags=["raybatch", "common-ai", "example"], params=PARAMS)
    def common_ai_llm_batch_operator() -> None:
        """``LLMBatchOperator`` with structured output: each answer is one of three labels (JSON schema)."""
        # A small model pads JSON with whitespace up to max_tokens unless the engine forbids it: add
        # "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": true}
        classify = LLMBatchOperator(
            task_id="classify_reviews",
            requests=[f"Review: {review!r}" for review in REVIEWS],
            result_path=f"{RESULT_PATH}/classify",
            llm_conn_id="ray_default",
            model_id="raybatch:{{ params.model }}",
            system_prompt="Classify the sentiment of this product review.",
            output_type=Literal["positive", "negative", "neutral"],
            max_tokens=64,
            request_params={"temperature": 0, "raybatch": RAYBATCH},
            poll_interval=30,
            deferrable=True,
        )
        summarize_manifest(classify.output)

    common_ai_llm_batch_operator()
