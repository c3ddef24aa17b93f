"""Apache Airflow provider for LLM batch inference with Ray Data and vLLM.

This module is imported by Airflow's provider manager and, on the Ray cluster, as the parent of
the shipped ``pipeline`` package, so it imports nothing beyond the standard library.
"""

from __future__ import annotations

from airflow_provider_raybatch.connection_form import provider_connection_type

__version__ = "0.1.0"

__all__ = ["__version__", "get_provider_info"]


def get_provider_info() -> dict:
    """Provider metadata read by Airflow's ProvidersManager (``airflow providers list``)."""
    return {
        "package-name": "airflow-provider-raybatch",
        "name": "Ray Batch LLM",
        "description": "Run LLM batch inference (Ray Data + vLLM) on a Ray cluster as an Airflow task.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Ray",
                "external-doc-url": "https://docs.ray.io/en/latest/cluster/running-applications/job-submission/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "Ray", "python-modules": ["airflow_provider_raybatch.operators.llm_batch"]}
        ],
        "sensors": [{"integration-name": "Ray", "python-modules": ["airflow_provider_raybatch.sensors.ray"]}],
        "hooks": [{"integration-name": "Ray", "python-modules": ["airflow_provider_raybatch.hooks.ray"]}],
        "triggers": [
            {"integration-name": "Ray", "python-modules": ["airflow_provider_raybatch.triggers.ray"]}
        ],
        "connection-types": [provider_connection_type()],
        "extra-links": [
            "airflow_provider_raybatch.links.RayJobLink",
            "airflow_provider_raybatch.links.BatchOutputLink",
            "airflow_provider_raybatch.links.RunReportLink",
        ],
        "config": {
            "raybatch": {
                "description": "The provider's settings: its jobs' identity, and the OpenAI-compatible "
                "Batch API served under /openai on the API server.",
                "options": {
                    "job_identity_secret": {
                        "description": "Secret that signs this deployment's Ray job ids, so that a job on "
                        "a shared Ray cluster is adopted or stopped only by the deployment that submitted "
                        "it. Set it to the same long random value on every worker. Empty: Airflow's "
                        "[core] fernet_key, else [api_auth] jwt_secret.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "sensitive": True,
                        "example": None,
                        "default": "",
                    },
                    "engine_pool_scope": {
                        "description": "Which warm engine pools (keep_warm_seconds) this deployment's jobs "
                        "share: jobs use a warm replica only when their scopes match. Deployments that "
                        "trust each other on one Ray cluster may set the same value (1-64 letters, digits, "
                        "'_', '.', '-') to share warm engines. Empty: a value derived from "
                        "job_identity_secret, so each deployment has pools of its own.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "analytics-team",
                        "default": "",
                    },
                    "openai_files_uri": {
                        "description": "Where uploaded files, batch records and batch outputs are kept: a "
                        "folder or s3://bucket/prefix that the Ray cluster can read and write too. "
                        "Empty: {AIRFLOW_HOME}/raybatch/openai.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "s3://my-bucket/openai-batches",
                        "default": "",
                    },
                    "openai_files_conn_id": {
                        "description": "Airflow connection for a remote openai_files_uri, e.g. an AWS "
                        "connection. Empty: the API server's own credentials.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "aws_default",
                        "default": "",
                    },
                    "openai_batch_dag_id": {
                        "description": "The DAG each batch runs as, built with "
                        "airflow_provider_raybatch.openai_api.dag.openai_batch_dag.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": None,
                        "default": "raybatch_openai_batch",
                    },
                    "openai_max_upload_bytes": {
                        "description": "The largest file upload, in bytes; past it the API answers 413 and "
                        "keeps nothing. OpenAI's own limit is 200 MB.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "200000000",
                    },
                    "openai_max_body_bytes": {
                        "description": "The largest request body other than an upload, in bytes "
                        "(413 past it).",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "1048576",
                    },
                    "openai_max_metadata_pairs": {
                        "description": "The most metadata keys a batch may carry (OpenAI: 16).",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "16",
                    },
                    "openai_max_metadata_key_chars": {
                        "description": "The longest metadata key, in characters (OpenAI: 64).",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "64",
                    },
                    "openai_max_files_per_user": {
                        "description": "The most uploads one user keeps at once; past it an upload answers "
                        "429 until they delete some.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "500",
                    },
                    "openai_max_open_batches_per_user": {
                        "description": "The most batches one user has open (inside their completion window "
                        "and not finished) at once; past it creating one answers 429.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "20",
                    },
                    "openai_max_metadata_value_chars": {
                        "description": "The longest metadata value, in characters (OpenAI: 512).",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": None,
                        "default": "512",
                    },
                },
            }
        },
    }
