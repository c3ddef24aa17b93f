"""Registers the OpenAI-compatible Batch API with the Airflow API server, under ``/openai``."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_raybatch.openai_api.app import create_app
from airflow_provider_raybatch.openai_api.settings import OpenAISettings

URL_PREFIX = "/openai"


class RayBatchOpenAIPlugin(AirflowPlugin):
    name = "raybatch_openai_batch_api"
    fastapi_apps = [
        {
            "app": create_app(OpenAISettings.from_airflow_config()),
            "url_prefix": URL_PREFIX,
            "name": "OpenAI-compatible Batch API (Ray Batch LLM)",
        }
    ]
