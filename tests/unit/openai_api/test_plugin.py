"""The plugin costs a task process nothing: Airflow loads every plugin in every task, for macros."""

from __future__ import annotations

import json
import subprocess
import sys

from airflow_provider_raybatch.openai_api.plugin import URL_PREFIX, RayBatchOpenAIPlugin


def test_importing_the_plugin_loads_neither_the_app_nor_the_api_server() -> None:
    code = (
        "import sys, json; import airflow_provider_raybatch.openai_api.plugin; "
        "print(json.dumps([m for m in ('airflow_provider_raybatch.openai_api.app', "
        "'airflow.api_fastapi.core_api.security', 'fastapi') if m in sys.modules]))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(loaded.strip().splitlines()[-1]) == []


def test_the_api_server_gets_the_app_under_openai(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__RAYBATCH__OPENAI_FILES_URI", str(tmp_path))
    [entry] = RayBatchOpenAIPlugin().fastapi_apps
    assert entry["url_prefix"] == URL_PREFIX == "/openai"
    paths = {route.path for route in entry["app"].routes}
    expected = {"/v1/files", "/v1/files/{file_id}/content", "/v1/batches", "/v1/batches/{batch_id}/cancel"}
    assert expected <= paths
