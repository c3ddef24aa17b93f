"""This provider on the trivial job and on the tiny model (bench/orchestration_vs_astro.py).

- ``orch_sensor_*``: a task submits the same trivial job as astro's SubmitRayJob (our RayHook), then
  ``RayJobSensor`` (deferrable) waits for it: at its default ``poke_interval`` (Airflow's 60 s) and 5 s.
- ``orch_llm_*``: ``RayLLMBatchOperator`` (deferrable) on the tiny model, at the default pace
  (``poll_interval_seconds=None``) and 5 s; the job is the batch pipeline, not the trivial job.
- ``orch_llm_worker``: the same operator with every setting at its default: ``deferrable`` is then
  Airflow's ``[operators] default_deferrable`` (False), so the task waits in its worker.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Param, dag, task

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.sensors.ray import RayJobSensor

#: The same trivial job as bench/dags_orchestration/astro/orch_astro.py: a driver that sleeps.
ENTRYPOINT = 'python -c "import time; time.sleep(20)"'


def _sensor_dag(dag_id: str, **kwargs: Any) -> None:  # Any: BaseSensorOperator's arguments.
    @dag(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["bench"])
    def _sensor() -> None:
        @task
        def submit_job() -> str:
            return RayHook().submit_job(ENTRYPOINT)

        sensor = RayJobSensor(
            task_id="wait_for_job",
            job_id="{{ ti.xcom_pull(task_ids='submit_job') }}",
            deferrable=True,
            **kwargs,
        )
        submit_job() >> sensor

    _sensor()


def _llm_dag(dag_id: str, deferrable: bool | None = True, **kwargs: Any) -> None:  # Any: its arguments
    """:param deferrable: None leaves the operator's default (Airflow's ``default_deferrable``)."""
    if deferrable is not None:
        kwargs["deferrable"] = deferrable

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["bench"],
        params={
            "model": Param("", type="string"),
            "input_uri": Param("", type="string"),
            "output_uri": Param("", type="string"),
        },
    )
    def _llm() -> None:
        # bench/airflow_dag.py's workload (dags/daily_company_industry.py's operator on the tiny model).
        RayLLMBatchOperator(
            task_id="classify_industry",
            model="{{ params.model }}",
            input_uri="{{ params.input_uri }}",
            output_uri="{{ params.output_uri }}",
            system_prompt="You classify companies by industry. Answer with the label only.",
            user_template="What industry is this company in: {Company}",
            sampling_params={
                "temperature": 0,
                "max_tokens": 16,
                "structured_outputs": {"choice": ["Law Firm", "Healthcare", "Other"]},
            },
            engine_kwargs={"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": True},
            replica_resources={"CPU": 1},
            id_column="Customer Id",
            keep_columns=["Company", "Country"],
            batch_size=64,
            **kwargs,
        )

    _llm()


_sensor_dag("orch_sensor_default")
_sensor_dag("orch_sensor_poll5", poke_interval=5)
_llm_dag("orch_llm_default")
_llm_dag("orch_llm_poll5", poll_interval_seconds=5)
_llm_dag("orch_llm_worker", deferrable=None)
