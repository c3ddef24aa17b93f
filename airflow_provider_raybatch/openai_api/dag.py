"""The DAG that runs each OpenAI batch: one task per run, whose paths come from the batch record.

The API (app.py) starts a run of it per batch, with the batch id as run id and no conf. The task
(:class:`OpenAIBatchRunOperator`) reads the batch record from the file store and derives everything
from it: the input is the uploaded file's bytes, the output the batch's own folder, the endpoint the
one the batch was created for, and the deadline its completion window. Nothing comes from the run
conf: anyone who may trigger this DAG could otherwise point a batch at any bucket or file the job's
credentials reach, or over another batch's output. Put one in your DAGs folder
(``dags/openai_batch_api.py``)::

    dag = openai_batch_dag(model="meta-llama/Llama-3.1-8B-Instruct", ray_conn_id="ray_default")
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.json_types import ArgValue

if TYPE_CHECKING:
    import jinja2
    from airflow.sdk import DAG, Context

#: The batch task's id; the API reads its state to tell a batch's status.
BATCH_TASK_ID = "run_batch"


class OpenAIBatchRunOperator(RayLLMBatchOperator):
    """A :class:`RayLLMBatchOperator` whose input, output, endpoint and deadline are the batch's.

    They are set when the task's fields are rendered (for ``execute`` and again for
    ``execute_complete`` after a deferral), from the record of the batch whose id is the run id.
    """

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        super().render_template_fields(context, jinja_env)
        from airflow.exceptions import AirflowFailException

        from airflow_provider_raybatch.openai_api.settings import OpenAISettings
        from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore

        run = context["dag_run"]
        if run.conf:
            raise AirflowFailException(
                f"This DAG runs batches of the OpenAI-compatible API and takes no run conf (got keys "
                f"{sorted(run.conf)[:10]}): create a batch with POST /openai/v1/batches instead."
            )
        settings = OpenAISettings.from_airflow_config()
        store = OpenAIStore(settings.files_uri, settings.files_conn_id)
        try:
            batch = store.batch(run.run_id)
            self.input_uri = store.upload_uri(batch["input_file_id"])
        except NotFoundError as err:
            raise AirflowFailException(
                f"Run {run.run_id!r} is no batch of the OpenAI-compatible API: no batch record has that "
                "id. Batches are created with POST /openai/v1/batches, never by triggering this DAG."
            ) from err
        started_by = getattr(run, "triggering_user_name", None)
        if batch.get("owner_name") is not None and started_by != batch["owner_name"]:
            raise AirflowFailException(
                f"Run {run.run_id!r} was started by {started_by!r}, not by the batch's owner: a batch runs "
                "only as the run the API started for it (clearing that run's task re-runs it)."
            )
        self.output_uri = store.output_uri(batch["id"])
        self.openai_endpoint = batch["endpoint"]
        left = batch["expires_at"] - time.time()
        if left <= 0:
            raise AirflowFailException(f"Batch {batch['id']} expired before it could finish.")
        # The completion window is the batch's deadline: past it the task times out and stops its job.
        if self.execution_timeout is None or self.execution_timeout.total_seconds() > left:
            self.execution_timeout = timedelta(seconds=left)


def openai_batch_dag(
    *, model: str, dag_id: str = DEFAULT_DAG_ID, max_active_runs: int = 4, **operator_kwargs: ArgValue
) -> DAG:
    """A DAG serving OpenAI batches with ``model``; the batch settings are the operator's.

    :param max_active_runs: batches that run at once; later ones wait as ``validating``.
    """
    from airflow.sdk import DAG

    for name in ("input_uri", "output_uri", "openai_endpoint"):
        if name in operator_kwargs:
            raise TypeError(f"openai_batch_dag() sets {name} from each batch; do not pass it.")
    with DAG(
        dag_id,
        schedule=None,
        max_active_runs=max_active_runs,
        is_paused_upon_creation=False,  # batches are started through the API, never by the schedule
        tags=["raybatch", "openai-batch"],
        doc_md=__doc__,
    ) as dag:
        OpenAIBatchRunOperator(
            task_id=BATCH_TASK_ID,
            model=model,
            # Placeholders, two distinct paths (checked with the rest as the DAG is parsed): each try's
            # are set from its batch's record before its spec is built.
            input_uri="set from the batch record: input",
            output_uri="set from the batch record: output",
            openai_endpoint="/v1/chat/completions",
            # OpenAI's semantics: a batch whose lines failed completes, its error file holding them
            # (request_counts.failed); only a batch none of whose lines succeeded fails.
            **{"max_failed_fraction": 1.0, **operator_kwargs},
        )
    return dag
