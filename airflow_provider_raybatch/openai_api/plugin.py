"""Registers the OpenAI-compatible Batch API with the Airflow API server, under ``/openai``.

Airflow loads every plugin in every task process too (for macros), so this module imports nothing
heavy: the FastAPI app, and the API server modules it needs, are built on first use of
``fastapi_apps``, which only the API server (and ``airflow plugins``) asks for.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/openai"


@cache
def _fastapi_app() -> dict[str, Any]:  # Any: the FastAPI app in Airflow's plugin entry.
    from airflow_provider_raybatch.openai_api.app import create_app
    from airflow_provider_raybatch.openai_api.settings import OpenAISettings

    return {
        "app": create_app(OpenAISettings.from_airflow_config()),
        "url_prefix": URL_PREFIX,
        "name": "OpenAI-compatible Batch API (Ray Batch LLM)",
    }


class RayBatchOpenAIPlugin(AirflowPlugin):
    """Loaded through the ``airflow.plugins`` entry point (Airflow instantiates it)."""

    name = "raybatch_openai_batch_api"

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]  # Any: see _fastapi_app.
        return [_fastapi_app()]
