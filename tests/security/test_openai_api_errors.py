"""A 503 never echoes the raw exception text (it once showed SQL with its parameters).

The route is called directly (no HTTP, no auth: those are in test_openai_api.py, on a real API
server, where starting a run does not fail); Airflow's ``trigger_dag`` is made to fail the way a
database error does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi import HTTPException

from airflow_provider_raybatch.openai_api import app as openai_app
from airflow_provider_raybatch.openai_api.settings import OpenAISettings
from airflow_provider_raybatch.openai_api.store import OpenAIStore

SECRET_SQL = "INSERT INTO dag_run (conf) VALUES ('password=hunter2')"


class _User:
    def get_id(self) -> str:
        return "alice"

    def get_name(self) -> str:
        return "alice"


def test_a_run_that_cannot_start_answers_503_without_the_exception_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import airflow.api.common.trigger_dag as trigger_module

    def failing_trigger(*args, **kwargs):
        raise RuntimeError(SECRET_SQL)

    monkeypatch.setattr(trigger_module, "trigger_dag", failing_trigger)
    settings = OpenAISettings(files_uri=str(tmp_path), files_conn_id=None, dag_id="raybatch_openai_batch")
    app = openai_app.create_app(settings)
    create_batch = next(
        route.endpoint for route in app.routes if getattr(route, "name", "") == "create_batch"
    )
    store = OpenAIStore(str(tmp_path))
    upload = store.add_file(iter([b"{}\n"]), "in.jsonl", "batch", owner="alice")
    body = openai_app.CreateBatchRequest(input_file_id=upload["id"], endpoint="/v1/chat/completions")

    with caplog.at_level(logging.ERROR), pytest.raises(HTTPException) as raised:
        create_batch(body=body, session=None, user=_User())
    assert raised.value.status_code == 503
    message = raised.value.detail["message"]
    assert "hunter2" not in message and "INSERT" not in message and "RuntimeError" in message
    assert "hunter2" in caplog.text  # the operator finds it in the API server's log
    assert store.batches() == []  # nothing kept of the batch that did not start
