"""The ``[raybatch]`` settings of the OpenAI-compatible Batch API (declared in the provider info)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DAG_ID = "raybatch_openai_batch"


@dataclass(frozen=True)
class OpenAISettings:
    #: Root of the file store (see store.py); the Ray cluster must reach it too.
    files_uri: str
    #: Airflow connection for a remote ``files_uri`` (e.g. an AWS connection for s3://); None: none.
    files_conn_id: str | None
    #: The DAG each batch runs as (built with :func:`..dag.openai_batch_dag`).
    dag_id: str

    @classmethod
    def from_airflow_config(cls) -> OpenAISettings:
        from airflow.configuration import AIRFLOW_HOME, conf

        return cls(
            files_uri=conf.get("raybatch", "openai_files_uri", fallback=None)
            or f"{AIRFLOW_HOME}/raybatch/openai",
            files_conn_id=conf.get("raybatch", "openai_files_conn_id", fallback=None) or None,
            dag_id=conf.get("raybatch", "openai_batch_dag_id", fallback=None) or DEFAULT_DAG_ID,
        )
