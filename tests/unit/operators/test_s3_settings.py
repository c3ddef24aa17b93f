"""Tests of RayLLMBatchOperator's S3 settings (``aws_conn_id``): when they are shipped, what they hold,
and that they travel only in an upload of their own that no runtime_env field names (no node unpacks
it), found by the job through its job package, never in the job's submit request.

The Airflow AWS connection comes from the environment; no AWS or Ray call is made (respx fakes the
Ray Jobs API).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from airflow.sdk.exceptions import TaskDeferred

import airflow_provider_raybatch
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.shared.job_settings import POOL_SCOPE_ENV
from airflow_provider_raybatch.shared.packaging import (
    JOB_MODULE,
    S3_SETTINGS_URI_FILE,
    build_provider_package,
)
from airflow_provider_raybatch.shared.s3_settings_upload import UPLOAD_PREFIX
from tests.conftest import POOL_SCOPE
from tests.unit.operators.test_llm_batch import FakeTI

#: The one env var every job gets: its deployment's engine pool scope (tests/conftest.py sets it).
SCOPE_ONLY = {POOL_SCOPE_ENV: POOL_SCOPE}

AWS_CONN_ID = "aws_test"
ACCESS_KEY = "AKIAUNITTEST000001"
SECRET_KEY = "unit/Secret+Key/0123456789abcdefSECRET"
ENDPOINT_URL = "http://127.0.0.1:9000"
REGION = "eu-west-1"
PACKAGE_PATH = r"/api/packages/gcs/[^/]+$"
PROVIDER_DIR = Path(airflow_provider_raybatch.__file__).parent


@pytest.fixture
def aws_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow AWS connection (from the environment) to a local S3-compatible store."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}",
        json.dumps(
            {
                "conn_type": "aws",
                "login": ACCESS_KEY,
                "password": SECRET_KEY,
                "extra": {"endpoint_url": ENDPOINT_URL, "region_name": REGION},
            }
        ),
    )
    return AWS_CONN_ID


def make_operator(**kwargs: Any) -> RayLLMBatchOperator:  # Any: operator arguments.
    arguments = {
        "task_id": "classify",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "input_uri": "s3://bucket/in/data.jsonl",
        "output_uri": "s3://bucket/out/",
        "user_template": "Industry of {Company}?",
        **kwargs,
    }
    return RayLLMBatchOperator(**arguments)


LOCAL = {"input_uri": "/data/in/data.jsonl", "output_uri": "/data/out/"}
EXPECTED = {
    "endpoint_url": ENDPOINT_URL,
    "region": REGION,
    "access_key": ACCESS_KEY,
    "secret_key": SECRET_KEY,
    "session_token": None,
}


def credentials_in(data: bytes) -> dict[str, Any] | None:  # Any: JSON values.
    """The S3 settings of an upload, or None when it is a zipped package (code or job package)."""
    return None if zipfile.is_zipfile(io.BytesIO(data)) else json.loads(data)


def settings_uri_in(data: bytes) -> str | None:
    """Where the job package in ``data`` says its S3 settings wait; None without settings or when
    ``data`` is not a job package."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        name = f"{JOB_MODULE}/{S3_SETTINGS_URI_FILE}"
        return archive.read(name).decode() if name in archive.namelist() else None


def uri_of(call: Any) -> str:  # Any: a respx call.
    return "gcs://" + call.request.url.path.rsplit("/", 1)[-1]


# -- _s3_settings -------------------------------------------------------------------------------


@pytest.mark.parametrize("aws_conn_id", [None, "", "None"])
def test_no_settings_without_a_connection(aws_conn_id: str | None, aws_conn: str) -> None:
    op = make_operator(aws_conn_id=aws_conn_id)

    assert op._s3_settings(op.build_spec()) is None


def test_no_settings_when_nothing_is_on_s3(aws_conn: str) -> None:
    op = make_operator(aws_conn_id=aws_conn, model="/models/tiny", **LOCAL)

    assert op._s3_settings(op.build_spec()) is None


def test_no_settings_when_nothing_is_on_s3_even_for_an_unknown_connection() -> None:
    """The connection is not even looked up when no URI needs it."""
    op = make_operator(aws_conn_id="aws_does_not_exist", **LOCAL)

    assert op._s3_settings(op.build_spec()) is None


def test_settings_from_the_aws_connection(aws_conn: str) -> None:
    op = make_operator(aws_conn_id=aws_conn)

    assert op._s3_settings(op.build_spec()) == EXPECTED


@pytest.mark.parametrize(
    "uris",
    [
        {"input_uri": "s3://bucket/in/data.jsonl", "output_uri": "/data/out/"},
        {"input_uri": "/data/in/data.jsonl", "output_uri": "s3://bucket/out/"},
        {**LOCAL, "model": "s3://models/tiny-llama/"},
    ],
    ids=["input", "output", "model"],
)
def test_settings_when_any_uri_is_on_s3(aws_conn: str, uris: dict[str, str]) -> None:
    op = make_operator(aws_conn_id=aws_conn, **uris)

    assert op._s3_settings(op.build_spec()) == EXPECTED


def test_settings_follow_the_rendered_connection_id(aws_conn: str) -> None:
    """``aws_conn_id`` is a template field: the rendered value is the one looked up."""
    assert "aws_conn_id" in RayLLMBatchOperator.template_fields
    op = make_operator(aws_conn_id="{{ params.aws_conn_id }}")
    op.aws_conn_id = aws_conn  # as rendering would

    assert op._s3_settings(op.build_spec()) == EXPECTED


# -- _runtime_env -------------------------------------------------------------------------------


@pytest.fixture
def packages(ray_api: respx.MockRouter) -> tuple[respx.Route, respx.Route]:
    """A cluster that has no package yet: every probe misses, every upload succeeds."""
    probes = ray_api.get(url__regex=PACKAGE_PATH).respond(404)
    uploads = ray_api.put(url__regex=PACKAGE_PATH).respond(200)
    return probes, uploads


def test_runtime_env_uploads_the_settings_for_no_field_and_names_them_in_the_job_package(
    aws_conn: str, hook: RayHook, packages: tuple[respx.Route, respx.Route]
) -> None:
    probes, uploads = packages
    op = make_operator(aws_conn_id=aws_conn)

    runtime_env = op._runtime_env(hook, op.build_spec())

    # Code, job package, then the settings last: the least time between their upload and the job.
    assert probes.call_count == uploads.call_count == 3
    code, job, settings = uploads.calls
    assert runtime_env["py_modules"] == [uri_of(code), uri_of(job)]
    assert runtime_env["py_modules"][0] == build_provider_package(PROVIDER_DIR).uri
    assert credentials_in(settings.request.content) == EXPECTED
    assert uri_of(settings).startswith(UPLOAD_PREFIX)
    # No node fetches the settings: their upload is in no runtime_env field, only in the job package.
    assert uri_of(settings) not in json.dumps(runtime_env)
    assert settings_uri_in(job.request.content) == uri_of(settings)
    assert SECRET_KEY not in json.dumps(runtime_env)
    assert ACCESS_KEY not in json.dumps(runtime_env)
    assert runtime_env["env_vars"] == SCOPE_ONLY  # no key travels as an env var


def test_runtime_env_without_a_connection_ships_only_the_code_and_the_spec(
    hook: RayHook, packages: tuple[respx.Route, respx.Route]
) -> None:
    probes, uploads = packages
    op = make_operator()

    runtime_env = op._runtime_env(hook, op.build_spec())

    assert probes.call_count == uploads.call_count == 2
    assert runtime_env["py_modules"] == [uri_of(call) for call in uploads.calls]
    assert runtime_env["py_modules"][0] == build_provider_package(PROVIDER_DIR).uri
    assert [settings_uri_in(call.request.content) for call in uploads.calls] == [None, None]


def test_runtime_env_with_a_connection_but_nothing_on_s3_ships_no_settings(
    aws_conn: str, hook: RayHook, packages: tuple[respx.Route, respx.Route]
) -> None:
    _, uploads = packages
    op = make_operator(aws_conn_id=aws_conn, **LOCAL)

    runtime_env = op._runtime_env(hook, op.build_spec())

    assert uploads.call_count == 2
    assert len(runtime_env["py_modules"]) == 2
    assert settings_uri_in(uploads.calls.last.request.content) is None


def test_each_runtime_env_gets_its_own_settings_upload(
    aws_conn: str, hook: RayHook, packages: tuple[respx.Route, respx.Route]
) -> None:
    """A random name: the same keys never give the same (guessable, shared) upload, which the first
    job's driver deletes."""
    op = make_operator(aws_conn_id=aws_conn)
    spec = op.build_spec()

    first = op._runtime_env(hook, spec)["py_modules"]
    second = op._runtime_env(hook, spec)["py_modules"]

    _, uploads = packages
    settings = [uri_of(call) for call in uploads.calls if credentials_in(call.request.content)]
    assert len(settings) == 2 and settings[0] != settings[1]
    assert first[0] == second[0]  # the same code
    assert first[1] != second[1]  # job packages naming different uploads


def test_runtime_env_keeps_the_users_entries_after_its_own(
    aws_conn: str, hook: RayHook, packages: tuple[respx.Route, respx.Route]
) -> None:
    user_env = {"env_vars": {"HF_HOME": "/models"}, "py_modules": ["s3://bucket/extra.zip"]}
    op = make_operator(aws_conn_id=aws_conn, runtime_env=user_env)

    runtime_env = op._runtime_env(hook, op.build_spec())

    assert runtime_env["env_vars"] == {"HF_HOME": "/models", **SCOPE_ONLY}
    assert len(runtime_env["py_modules"]) == 3
    assert runtime_env["py_modules"][2] == "s3://bucket/extra.zip"
    assert op.runtime_env == user_env


# -- the whole submit ---------------------------------------------------------------------------


def test_execute_never_sends_the_keys_outside_their_own_upload(
    aws_conn: str, ray_conn: str, ray_api: respx.MockRouter, packages: tuple[respx.Route, respx.Route]
) -> None:
    _, uploads = packages
    ray_api.get("/api/jobs/").respond(json=[])
    submit = ray_api.post("/api/jobs/").mock(
        side_effect=lambda request: httpx.Response(
            200, json={"submission_id": json.loads(request.content)["submission_id"]}
        )
    )
    op = make_operator(aws_conn_id=aws_conn, ray_conn_id=ray_conn, deferrable=True)

    with pytest.raises(TaskDeferred):
        op.execute({"ti": FakeTI()})

    assert submit.call_count == 1
    body_text = submit.calls.last.request.content.decode()
    body = json.loads(body_text)
    for secret in (SECRET_KEY, ACCESS_KEY, json.dumps(SECRET_KEY)[1:-1]):
        assert secret not in body_text
    assert SECRET_KEY not in body["entrypoint"]
    assert body["runtime_env"]["env_vars"] == SCOPE_ONLY
    # The settings reach the job only through their own upload, named in the job package alone.
    credential_uploads = [call for call in uploads.calls if credentials_in(call.request.content) is not None]
    assert len(credential_uploads) == 1
    assert credentials_in(credential_uploads[0].request.content) == EXPECTED
    settings_uri = uri_of(credential_uploads[0])
    assert settings_uri not in body_text
    job_packages = [call for call in uploads.calls if uri_of(call) in body["runtime_env"]["py_modules"]]
    assert [settings_uri_in(call.request.content) for call in job_packages].count(settings_uri) == 1
    # No other request (probes, listing, uploads of code) carries a key in clear either.
    for call in ray_api.calls:
        if any(call is upload for upload in credential_uploads):
            continue
        assert SECRET_KEY.encode() not in call.request.content
        assert SECRET_KEY not in str(call.request.url)
        assert SECRET_KEY not in " ".join(call.request.headers.values())
