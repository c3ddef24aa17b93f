"""``@task.llm_batch`` / ``LLMBatchOperator`` (apache-airflow-providers-common-ai) on a Ray cluster.

common.ai picks a batch adapter by the ``model_id`` prefix: ``raybatch:<model>`` with a ``ray``
connection runs the batch as this provider's Ray job (:mod:`.adapter`). This package's
``__init__`` imports nothing, so the provider stays importable without common.ai installed; only
common.ai's dispatch (through the ``airflow.providers.common.ai.batch_adapters`` entry point) loads
:mod:`.adapter`. See docs/common-ai-llm-batch.md.
"""
