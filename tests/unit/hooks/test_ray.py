"""Tests of airflow_provider_raybatch/hooks/ray.py against a fake Ray Jobs API (respx)."""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx
from airflow.sdk import Connection

import airflow_provider_raybatch.hooks.ray as ray_hook_module
from airflow_provider_raybatch.hooks.ray import (
    DEFAULT_TIMEOUT_SECONDS,
    JobInfo,
    JobStatus,
    RayConnectionSettings,
    RayHook,
)
from airflow_provider_raybatch.shared.exceptions import (
    RayAuthError,
    RayHookError,
    RayJobAlreadyExistsError,
    RayJobNotFoundError,
)
from airflow_provider_raybatch.shared.packaging import RayPackage

from ..conftest import RAY_TOKEN, RAY_URL


def connection(**fields: Any) -> Connection:  # Any: Connection's fields.
    extra = fields.pop("extra", None)
    return Connection(
        conn_id="ray_test", conn_type="ray", extra=None if extra is None else json.dumps(extra), **fields
    )


# -- connection settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "base_url"),
    [
        ({"host": "ray.test"}, "http://ray.test:8265"),
        ({"host": "ray.test", "port": 9000}, "http://ray.test:9000"),
        ({"host": "http://ray.test"}, "http://ray.test:8265"),
        ({"host": "http://ray.test/"}, "http://ray.test:8265"),
        ({"host": "https://ray.example.com", "port": 443}, "https://ray.example.com:443"),
        ({"host": "https://ray.example.com:8443"}, "https://ray.example.com:8443"),
        ({"host": "ray.test", "schema": "https"}, "https://ray.test"),
        ({"host": "ray.test", "extra": {"scheme": "https"}}, "https://ray.test"),
        ({}, "http://127.0.0.1:8265"),
    ],
)
def test_base_url_from_connection(fields: dict[str, Any], base_url: str) -> None:
    assert RayConnectionSettings.from_connection(connection(**fields)).base_url == base_url


def test_defaults_from_a_bare_connection() -> None:
    settings = RayConnectionSettings.from_connection(connection(host="ray.test"))

    assert settings.headers == {}
    assert settings.cookies == {}
    assert settings.verify is True
    assert settings.timeout_seconds == DEFAULT_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    "fields", [{"password": RAY_TOKEN}, {"extra": {"token": RAY_TOKEN}}], ids=["password", "extra-token"]
)
def test_token_becomes_bearer_header(fields: dict[str, Any]) -> None:
    settings = RayConnectionSettings.from_connection(connection(host="ray.test", **fields))

    assert settings.headers == {"Authorization": f"Bearer {RAY_TOKEN}"}


@pytest.mark.parametrize("header_name", ["Authorization", "authorization"])
def test_user_authorization_header_is_not_overridden(header_name: str) -> None:
    conn = connection(
        host="ray.test", password=RAY_TOKEN, extra={"headers": {header_name: "Basic abc", "X-Team": "ml"}}
    )

    settings = RayConnectionSettings.from_connection(conn)

    assert settings.headers == {header_name: "Basic abc", "X-Team": "ml"}


@pytest.mark.parametrize(
    ("verify", "expected"),
    [
        ("false", False),
        ("False", False),
        ("true", True),
        ("TRUE", True),
        (False, False),
        (True, True),
        ("/etc/ssl/ray-ca.pem", "/etc/ssl/ray-ca.pem"),
    ],
)
def test_verify(verify: bool | str, expected: bool | str) -> None:
    settings = RayConnectionSettings.from_connection(connection(host="ray.test", extra={"verify": verify}))

    assert settings.verify == expected
    assert type(settings.verify) is type(expected)


def test_cookies_and_timeout_from_extra() -> None:
    conn = connection(host="ray.test", extra={"cookies": {"session": 1}, "timeout_seconds": "7.5"})

    settings = RayConnectionSettings.from_connection(conn)

    assert settings.cookies == {"session": "1"}
    assert settings.timeout_seconds == 7.5
    kwargs = settings.client_kwargs()
    assert kwargs.pop("verify").verify_mode == ssl.CERT_REQUIRED  # a shared context (test_retries.py)
    assert dict(httpx.Cookies(kwargs.pop("cookies"))) == {"session": "1"}
    assert kwargs == {"base_url": "http://ray.test:8265", "headers": {}, "timeout": 7.5}


def test_hook_reads_its_airflow_connection(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    route = ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    hook = RayHook(ray_conn_id=ray_conn)

    assert hook.dashboard_url == RAY_URL
    assert hook.get_job_status("j1") == JobStatus.RUNNING
    assert route.calls.last.request.headers["Authorization"] == f"Bearer {RAY_TOKEN}"


def test_ui_field_behaviour_hides_unused_fields() -> None:
    behaviour = RayHook.get_ui_field_behaviour()

    assert set(behaviour["hidden_fields"]) == {"schema", "login"}
    assert behaviour["placeholders"]["port"] == "8265"


# -- jobs ---------------------------------------------------------------------------------------


def test_submit_job_sends_only_given_keys(hook: RayHook, ray_api: respx.MockRouter) -> None:
    route = ray_api.post("/api/jobs/").respond(json={"submission_id": "raybatch-x", "job_id": None})

    job_id = hook.submit_job(
        "python -m pipeline --spec '{}'",
        submission_id="raybatch-x",
        runtime_env={"py_modules": ["gcs://_ray_pkg_abc.zip"]},
        metadata={"airflow_dag_id": "d"},
        entrypoint_resources={"head": 1.0},
    )

    assert job_id == "raybatch-x"
    request = route.calls.last.request
    assert request.headers["Authorization"] == f"Bearer {RAY_TOKEN}"
    assert json.loads(request.content) == {
        "entrypoint": "python -m pipeline --spec '{}'",
        "submission_id": "raybatch-x",
        "runtime_env": {"py_modules": ["gcs://_ray_pkg_abc.zip"]},
        "metadata": {"airflow_dag_id": "d"},
        "entrypoint_resources": {"head": 1.0},
    }


def test_submit_job_minimal_body(hook: RayHook, ray_api: respx.MockRouter) -> None:
    route = ray_api.post("/api/jobs/").respond(json={"submission_id": "raysubmit_1"})

    assert hook.submit_job("echo hi", entrypoint_num_cpus=0) == "raysubmit_1"
    assert json.loads(route.calls.last.request.content) == {"entrypoint": "echo hi", "entrypoint_num_cpus": 0}


@pytest.mark.parametrize("status", [400, 500])
def test_submit_existing_job_raises_already_exists(
    hook: RayHook, ray_api: respx.MockRouter, status: int
) -> None:
    ray_api.post("/api/jobs/").respond(
        status,
        text='Traceback (most recent call last):\n  File "job_head.py", line 1\n'
        "ValueError: Job with submission_id raybatch-x already exists. Please use a different submission_id.",
    )

    with pytest.raises(RayJobAlreadyExistsError) as info:
        hook.submit_job("echo", submission_id="raybatch-x")

    message = str(info.value)
    assert info.value.status_code == status
    assert f"POST /api/jobs/ -> {status}" in message  # the status Ray really answered
    assert "raybatch-x already exists" in message
    assert "Traceback" not in message  # the reason, not the server's traceback


def test_other_400_is_a_plain_hook_error(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.post("/api/jobs/").respond(400, text="bad runtime_env")

    with pytest.raises(RayHookError) as info:
        hook.submit_job("echo")

    assert type(info.value) is RayHookError
    assert "POST /api/jobs/ -> 400" in str(info.value)
    assert "bad runtime_env" in str(info.value)


def test_get_job_info_parses(hook: RayHook, ray_api: respx.MockRouter, job_payload: Any) -> None:
    ray_api.get("/api/jobs/j1").respond(
        json=job_payload(
            "j1",
            "FAILED",
            message="Job failed",
            metadata={"k": "v"},
            error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
            driver_exit_code=1,
            end_time=1_700_000_100_000,
        )
    )

    info = hook.get_job_info("j1")

    assert info == JobInfo(
        job_id="j1",
        status=JobStatus.FAILED,
        message="Job failed",
        entrypoint="python -m airflow_provider_raybatch.pipeline --spec '{}'",
        metadata={"k": "v"},
        error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
        driver_exit_code=1,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_100_000,
    )
    assert info.status.is_terminal


def test_job_info_falls_back_to_job_id_and_tolerates_nulls() -> None:
    info = JobInfo.from_api(
        {"job_id": "02000000", "submission_id": None, "status": "PENDING", "message": None}
    )

    assert info.job_id == "02000000"
    assert info.message == ""
    assert info.metadata == {}
    assert not info.status.is_terminal


@pytest.mark.parametrize(
    ("status", "terminal"),
    [("PENDING", False), ("RUNNING", False), ("STOPPED", True), ("SUCCEEDED", True), ("FAILED", True)],
)
def test_job_status_is_terminal(status: str, terminal: bool) -> None:
    assert JobStatus(status).is_terminal is terminal


def test_job_id_is_quoted_in_the_path(hook: RayHook, ray_api: respx.MockRouter, job_payload: Any) -> None:
    route = ray_api.get(url__regex=r"/api/jobs/a%2Fb%20c$").respond(json=job_payload("a/b c", "RUNNING"))

    assert hook.get_job_info("a/b c").job_id == "a/b c"
    assert route.called


def test_unknown_job_raises_not_found(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/nope").respond(404, text="Job nope does not exist")

    with pytest.raises(RayJobNotFoundError) as info:
        hook.get_job_info("nope")

    assert info.value.status_code == 404
    assert "GET /api/jobs/nope -> 404" in str(info.value)


def test_404_outside_jobs_is_a_plain_hook_error(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/version").respond(404, text="no such route")

    with pytest.raises(RayHookError) as info:
        hook.get_version()

    assert type(info.value) is RayHookError


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_mention_the_token_but_never_show_it(
    hook: RayHook, ray_api: respx.MockRouter, status: int
) -> None:
    ray_api.get("/api/jobs/j1").respond(status, text="Unauthorized: invalid or missing token")

    with pytest.raises(RayAuthError) as info:
        hook.get_job_info("j1")

    message = str(info.value)
    assert info.value.status_code == status
    assert "token" in message
    assert "password" in message
    assert RAY_TOKEN not in message
    assert RAY_TOKEN not in repr(info.value.args)


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("Connection refused"), httpx.ReadTimeout("timed out")],
    ids=["connect", "timeout"],
)
def test_transport_errors_become_hook_errors(
    hook: RayHook, ray_api: respx.MockRouter, error: Exception
) -> None:
    ray_api.get("/api/jobs/j1").mock(side_effect=error)

    with pytest.raises(RayHookError) as info:
        hook.get_job_info("j1")

    assert f"Ray Jobs API at {RAY_URL} unreachable" in str(info.value)
    assert info.value.status_code is None
    assert isinstance(info.value.__cause__, httpx.HTTPError)
    assert RAY_TOKEN not in str(info.value)


def test_list_jobs(hook: RayHook, ray_api: respx.MockRouter, job_payload: Any) -> None:
    ray_api.get("/api/jobs/").respond(json=[job_payload("a", "RUNNING"), job_payload("b", "SUCCEEDED")])

    jobs = hook.list_jobs()

    assert [(job.job_id, job.status) for job in jobs] == [
        ("a", JobStatus.RUNNING),
        ("b", JobStatus.SUCCEEDED),
    ]


@pytest.mark.parametrize(("answer", "expected"), [({"stopped": True}, True), ({"stopped": False}, False)])
def test_stop_job(hook: RayHook, ray_api: respx.MockRouter, answer: dict, expected: bool) -> None:
    route = ray_api.post("/api/jobs/j1/stop").respond(json=answer)

    assert hook.stop_job("j1") is expected
    assert route.call_count == 1


def test_get_job_logs(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": "line 1\nline 2\n"})

    assert hook.get_job_logs("j1") == "line 1\nline 2\n"


def test_get_job_log_tail_returns_the_last_lines(hook: RayHook, ray_api: respx.MockRouter) -> None:
    log = "".join(f"line {n}\n" for n in range(1, 101))
    ray_api.get("/api/jobs/j1/logs").respond(json={"logs": log})

    assert hook.get_job_log_tail("j1", lines=3) == "line 98\nline 99\nline 100"
    assert hook.get_job_log_tail("j1").splitlines() == [f"line {n}" for n in range(61, 101)]


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(500, text="boom"), httpx.Response(404, text="gone"), httpx.ConnectError("refused")],
    ids=["500", "404", "unreachable"],
)
def test_get_job_log_tail_is_empty_on_error(hook: RayHook, ray_api: respx.MockRouter, answer: Any) -> None:
    ray_api.get("/api/jobs/j1/logs").mock(side_effect=[answer])

    assert hook.get_job_log_tail("j1") == ""


# -- packages -----------------------------------------------------------------------------------

PACKAGE = RayPackage(uri="gcs://_ray_pkg_0123abcd.zip", data=b"PK\x03\x04zip bytes")


def test_upload_package_puts_when_the_cluster_lacks_it(hook: RayHook, ray_api: respx.MockRouter) -> None:
    probe = ray_api.get("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(404)
    upload = ray_api.put("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200)

    assert hook.upload_package(PACKAGE) == "gcs://_ray_pkg_0123abcd.zip"
    assert probe.call_count == 1
    assert upload.call_count == 1
    assert upload.calls.last.request.content == PACKAGE.data


def test_upload_package_skips_a_package_the_cluster_has(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200)
    upload = ray_api.put("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200)

    assert hook.upload_package(PACKAGE) == PACKAGE.uri
    assert not upload.called


def test_upload_package_raises_when_the_probe_fails(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(500, text="gcs down")
    upload = ray_api.put("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200)

    with pytest.raises(RayHookError, match="500"):
        hook.upload_package(PACKAGE)
    assert not upload.called


def test_upload_package_raises_when_the_put_fails(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(404)
    ray_api.put("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(413, text="too large")

    with pytest.raises(RayHookError, match="PUT /api/packages/gcs/_ray_pkg_0123abcd.zip -> 413"):
        hook.upload_package(PACKAGE)


# -- sync and async twins -----------------------------------------------------------------------

TWINS = [
    pytest.param("get_job_info", "GET", "/api/jobs/j1", "RUNNING-JOB", id="get_job_info"),
    pytest.param("get_job_status", "GET", "/api/jobs/j1", "RUNNING-JOB", id="get_job_status"),
    pytest.param("stop_job", "POST", "/api/jobs/j1/stop", {"stopped": True}, id="stop_job"),
    pytest.param("get_job_logs", "GET", "/api/jobs/j1/logs", {"logs": "hello\n"}, id="get_job_logs"),
]


@pytest.mark.parametrize(("name", "method", "path", "answer"), TWINS)
async def test_async_twin_matches_sync(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, name: str, method: str, path: str, answer: Any
) -> None:
    body = job_payload("j1", "RUNNING") if answer == "RUNNING-JOB" else answer
    route = ray_api.request(method, path).respond(json=body)

    sync_result = getattr(hook, name)("j1")
    async_result = await getattr(hook, f"a_{name}")("j1")

    assert async_result == sync_result
    assert route.call_count == 2
    sync_request, async_request = (call.request for call in route.calls)
    assert async_request.method == sync_request.method == method
    assert async_request.url == sync_request.url
    assert async_request.headers["Authorization"] == sync_request.headers["Authorization"]


@pytest.mark.parametrize(("name", "method", "path", "answer"), TWINS)
@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(404, text="no such job"), RayJobNotFoundError),
        (httpx.Response(401), RayAuthError),
        (httpx.Response(503, text="head restarting"), RayHookError),
    ],
    ids=["404", "401", "503"],
)
async def test_async_twin_raises_like_sync(
    hook: RayHook,
    ray_api: respx.MockRouter,
    name: str,
    method: str,
    path: str,
    answer: Any,
    response: httpx.Response,
    error: type[Exception],
) -> None:
    ray_api.request(method, path).mock(return_value=response)

    with pytest.raises(error) as sync_info:
        getattr(hook, name)("j1")
    with pytest.raises(error) as async_info:
        await getattr(hook, f"a_{name}")("j1")

    assert type(async_info.value) is type(sync_info.value)
    assert str(async_info.value) == str(sync_info.value)


async def test_async_transport_error(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/jobs/j1").mock(side_effect=httpx.ConnectError("refused"))

    with pytest.raises(RayHookError, match="unreachable"):
        await hook.a_get_job_info("j1")


async def test_async_settings_from_the_airflow_connection(
    ray_conn: str, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    route = ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "SUCCEEDED"))

    status = await RayHook(ray_conn_id=ray_conn).a_get_job_status("j1")

    assert status == JobStatus.SUCCEEDED
    assert route.calls.last.request.headers["Authorization"] == f"Bearer {RAY_TOKEN}"


async def test_async_calls_share_one_client_per_loop_and_settings(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))
    other = RayHook(ray_conn_id="unused")
    other._settings = hook.settings
    stranger = RayHook(ray_conn_id="unused")
    stranger._settings = replace(hook.settings, headers={"Authorization": "Bearer another-token"})

    await hook.a_get_job_info("j1")
    await other.a_get_job_info("j1")
    await stranger.a_get_job_info("j1")

    clients = ray_hook_module._ASYNC_CLIENTS[asyncio.get_running_loop()]
    assert set(clients) == {hook.settings.client_key(), stranger.settings.client_key()}


async def test_async_calls_beyond_the_limit_wait_their_turn(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("airflow_provider_raybatch.hooks.async_client.MAX_CONCURRENT_ASYNC_CALLS", 2)
    in_flight, most = 0, 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, json=job_payload("j1", "RUNNING"))

    ray_api.get("/api/jobs/j1").mock(side_effect=answer)

    infos = await asyncio.gather(*(hook.a_get_job_info("j1") for _ in range(6)))

    assert [info.status for info in infos] == [JobStatus.RUNNING] * 6
    assert most == 2


async def test_shared_client_keeps_no_cookie_an_answer_sets(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    hook._settings = replace(hook.settings, cookies={"affinity": "a1"})
    route = ray_api.get("/api/jobs/j1").respond(
        json=job_payload("j1", "RUNNING"), headers={"Set-Cookie": "session=from-answer; Path=/"}
    )

    await hook.a_get_job_info("j1")
    await hook.a_get_job_info("j1")

    assert route.calls.last.request.headers["Cookie"] == "affinity=a1"


# -- test_connection ----------------------------------------------------------------------------


def test_test_connection_ok(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/version").respond(json={"version": "4", "ray_version": "2.60.0", "ray_commit": "abc"})
    jobs = ray_api.get("/api/jobs/").respond(json=[])

    ok, message = hook.test_connection()

    assert ok is True
    assert message == f"Connected to Ray 2.60.0 at {RAY_URL}."
    assert jobs.called  # the token is checked, not only reachability


def test_test_connection_bad_token(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/version").respond(json={"ray_version": "2.60.0"})
    ray_api.get("/api/jobs/").respond(401)

    ok, message = hook.test_connection()

    assert ok is False
    assert "token" in message
    assert RAY_TOKEN not in message


def test_test_connection_unreachable(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/version").mock(side_effect=httpx.ConnectError("Connection refused"))

    ok, message = hook.test_connection()

    assert ok is False
    assert "unreachable" in message
