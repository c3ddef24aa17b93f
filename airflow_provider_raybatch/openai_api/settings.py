"""The ``[raybatch]`` settings of the OpenAI-compatible Batch API (declared in the provider info)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DAG_ID = "raybatch_openai_batch"
#: OpenAI's own limits: a batch input file of up to 200 MB; metadata of up to 16 pairs, keys of up
#: to 64 characters and values of up to 512.
DEFAULT_MAX_UPLOAD_BYTES = 200 * 1000 * 1000
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_METADATA_PAIRS = 16
DEFAULT_MAX_METADATA_KEY_CHARS = 64
DEFAULT_MAX_METADATA_VALUE_CHARS = 512
#: Per user: uploads kept at once, and batches open (not yet past their window) at once.
DEFAULT_MAX_FILES_PER_USER = 500
DEFAULT_MAX_OPEN_BATCHES_PER_USER = 20


@dataclass(frozen=True)
class OpenAISettings:
    #: Root of the file store (see store.py); the Ray cluster must reach it too.
    files_uri: str
    #: Airflow connection for a remote ``files_uri`` (e.g. an AWS connection for s3://); None: none.
    files_conn_id: str | None
    #: The DAG each batch runs as (built with :func:`..dag.openai_batch_dag`).
    dag_id: str
    #: The largest upload, in bytes (413 past it).
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    #: The largest request body other than an upload, in bytes (413 past it).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_metadata_pairs: int = DEFAULT_MAX_METADATA_PAIRS
    max_metadata_key_chars: int = DEFAULT_MAX_METADATA_KEY_CHARS
    max_metadata_value_chars: int = DEFAULT_MAX_METADATA_VALUE_CHARS
    #: One user's uploads at once (429 past it): nobody fills the store or slows others' listings.
    max_files_per_user: int = DEFAULT_MAX_FILES_PER_USER
    #: One user's open batches at once (429 past it): nobody queues hundreds ahead of everyone else.
    max_open_batches_per_user: int = DEFAULT_MAX_OPEN_BATCHES_PER_USER

    @classmethod
    def from_airflow_config(cls) -> OpenAISettings:
        from airflow.configuration import AIRFLOW_HOME, conf

        def limit(option: str, default: int) -> int:
            value = conf.getint("raybatch", option, fallback=default)
            if value < 1:
                raise ValueError(f"[raybatch] {option} = {value}: give a positive number.")
            return value

        return cls(
            files_uri=conf.get("raybatch", "openai_files_uri", fallback=None)
            or f"{AIRFLOW_HOME}/raybatch/openai",
            files_conn_id=conf.get("raybatch", "openai_files_conn_id", fallback=None) or None,
            dag_id=conf.get("raybatch", "openai_batch_dag_id", fallback=None) or DEFAULT_DAG_ID,
            max_upload_bytes=limit("openai_max_upload_bytes", DEFAULT_MAX_UPLOAD_BYTES),
            max_body_bytes=limit("openai_max_body_bytes", DEFAULT_MAX_BODY_BYTES),
            max_metadata_pairs=limit("openai_max_metadata_pairs", DEFAULT_MAX_METADATA_PAIRS),
            max_metadata_key_chars=limit("openai_max_metadata_key_chars", DEFAULT_MAX_METADATA_KEY_CHARS),
            max_metadata_value_chars=limit(
                "openai_max_metadata_value_chars", DEFAULT_MAX_METADATA_VALUE_CHARS
            ),
            max_files_per_user=limit("openai_max_files_per_user", DEFAULT_MAX_FILES_PER_USER),
            max_open_batches_per_user=limit(
                "openai_max_open_batches_per_user", DEFAULT_MAX_OPEN_BATCHES_PER_USER
            ),
        )
