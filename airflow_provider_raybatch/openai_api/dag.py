"""The DAG that runs each OpenAI batch: one :class:`RayLLMBatchOperator` task fed by the run's conf.

The API (app.py) starts a run of it per batch, with ``input_uri``, ``output_uri`` and ``endpoint`` in
the run's conf and the batch id as run id. Put one in your DAGs folder (``dags/openai_batch_api.py``)::

    dag = openai_batch_dag(model="meta-llama/Llama-3.1-8B-Instruct", ray_conn_id="ray_default")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID

if TYPE_CHECKING:
    from airflow.sdk import DAG

#: The batch task's id; the API reads its state to tell a batch's status.
BATCH_TASK_ID = "run_batch"


def openai_batch_dag(
    *, model: str, dag_id: str = DEFAULT_DAG_ID, max_active_runs: int = 4, **operator_kwargs: Any
) -> DAG:  # Any: RayLLMBatchOperator's arguments (engine_kwargs, concurrency, aws_conn_id, ...).
    """A DAG serving OpenAI batches with ``model``; the batch settings are the operator's.

    :param max_active_runs: batches that run at once; later ones wait as ``validating``.
    """
    from airflow.sdk import DAG, Param

    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

    with DAG(
        dag_id,
        schedule=None,
        max_active_runs=max_active_runs,
        is_paused_upon_creation=False,  # batches are started through the API, never by the schedule
        params={
            "input_uri": Param("", type="string", description="The batch's input file (set by the API)."),
            "output_uri": Param("", type="string", description="Where its output goes (set by the API)."),
            "endpoint": Param("/v1/chat/completions", type="string", description="The batch's endpoint."),
        },
        tags=["raybatch", "openai-batch"],
        doc_md=__doc__,
    ) as dag:
        RayLLMBatchOperator(
            task_id=BATCH_TASK_ID,
            model=model,
            input_uri="{{ params.input_uri }}",
            output_uri="{{ params.output_uri }}",
            openai_endpoint="{{ params.endpoint }}",
            # OpenAI's semantics: a batch whose lines failed completes, its error file holding them
            # (request_counts.failed); only a batch none of whose lines succeeded fails.
            **{"max_failed_fraction": 1.0, **operator_kwargs},
        )
    return dag
