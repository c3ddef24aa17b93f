"""A dashboard behind a proxy (airflow_provider_raybatch/hooks/ray.py): path prefixes, redirects, login pages.

A 3xx (an SSO proxy whose cookie expired) must not count as success, nor its HTML be parsed as JSON
(that crashed the trigger); ``http://gateway/ray`` must not become ``http://gateway/ray:8265``.
Sync calls go through respx, async ones through the respx bridge of conftest (real aiohttp).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import aiohttp.connector
import httpx
import pytest
import respx
from airflow.sdk import Connection

from airflow_provider_raybatch.hooks.ray import JobStatus, RayConnectionSettings, RayHook
from airflow_provider_raybatch.links import ray_job_url
from airflow_provider_raybatch.shared.exceptions import (
    RayHookError,
    RayUnavailableError,
    RayUnexpectedResponseError,
)
from airflow_provider_raybatch.shared.packaging import RayPackage
from airflow_provider_raybatch.triggers.ray import RayJobTrigger

from ..conftest import RAY_TOKEN, RAY_URL, RespxBridge, _BridgeResolver, nodes_payload
from .test_ray import connection

# -- the connection's host forms -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "base_url"),
    [
        # The case: a path prefix keeps the port out of the path, and gets no 8265 (a proxy).
        ({"host": "http://gateway/ray"}, "http://gateway/ray"),
        ({"host": "http://gateway/ray/"}, "http://gateway/ray"),
        ({"host": "http://gateway/ray", "port": 8080}, "http://gateway:8080/ray"),
        ({"host": "http://gateway:8080/ray/"}, "http://gateway:8080/ray"),
        ({"host": "http://gateway:8080/ray/", "port": 8080}, "http://gateway:8080/ray"),
        ({"host": "https://gateway.example.com/ray/"}, "https://gateway.example.com/ray"),
        ({"host": "https://gateway.example.com/ray/", "port": 8443}, "https://gateway.example.com:8443/ray"),
        ({"host": "https://gateway.example.com:8443/ray/"}, "https://gateway.example.com:8443/ray"),
        ({"host": "https://gateway.example.com/team/ml/ray"}, "https://gateway.example.com/team/ml/ray"),
        # No double slashes, whatever the host field holds.
        ({"host": "https://gateway.example.com//ray//dash//"}, "https://gateway.example.com/ray/dash"),
        # Without a scheme: the schema field or extra 'scheme', else http.
        ({"host": "gateway/ray"}, "http://gateway/ray"),
        (
            {"host": "gateway.example.com/ray/", "extra": {"scheme": "https"}},
            "https://gateway.example.com/ray",
        ),
        ({"host": "gateway:8080/ray"}, "http://gateway:8080/ray"),
        # A dashboard page's address copied from the browser: the fragment never reaches the server.
        ({"host": "https://gateway.example.com/ray/#/jobs"}, "https://gateway.example.com/ray"),
        ({"host": "http://ray.test/#/overview"}, "http://ray.test:8265"),
        # Bare dashboards, as before.
        ({"host": "ray.test:9000"}, "http://ray.test:9000"),
        ({"host": " http://ray.test "}, "http://ray.test:8265"),
        ({"host": "HTTPS://Ray.Example.com/Ray"}, "https://ray.example.com/Ray"),
        ({"host": "http://[::1]"}, "http://[::1]:8265"),
        ({"host": "http://[::1]:9000/ray"}, "http://[::1]:9000/ray"),
    ],
)
def test_base_url_of_host_forms(fields: dict[str, Any], base_url: str) -> None:
    assert RayConnectionSettings.from_connection(connection(**fields)).base_url == base_url


def test_a_url_encoded_host_in_a_ray_uri_keeps_its_prefix() -> None:
    conn = Connection(conn_id="ray_test", uri="ray://:tok@https%3A%2F%2Fgateway.example.com%2Fray%2F")

    assert RayConnectionSettings.from_connection(conn).base_url == "https://gateway.example.com/ray"


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        ({"host": "https://gateway.example.com:8443/ray", "port": 9000}, ["8443", "9000", "port field"]),
        ({"host": "https://gateway.example.com/ray?x=1"}, ["query", "?x=1"]),
        ({"host": "ftp://gateway/ray"}, ["'ftp'", "http or https"]),
        # A ray:// URI's path lands in the schema field: not a scheme; the message says where a prefix goes.
        ({"host": "gateway.example.com", "schema": "ray"}, ["schema field", "'ray'", "URL-encode"]),
        ({"host": "http://gateway:80a/ray"}, ["invalid port"]),
        ({"host": "http:///ray"}, ["names no host"]),
    ],
    ids=["two-ports", "query", "scheme", "uri-path", "bad-port", "no-host"],
)
def test_unusable_host_forms_name_the_field_and_the_fix(fields: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(RayHookError) as info:
        RayConnectionSettings.from_connection(connection(**fields))

    for fragment in fragments:
        assert fragment in str(info.value)


def test_credentials_in_the_host_are_refused_without_being_shown() -> None:
    conn = connection(host=f"https://admin:{RAY_TOKEN}@gateway.example.com/ray")

    with pytest.raises(RayHookError, match="user name or password") as info:
        RayConnectionSettings.from_connection(conn)

    assert RAY_TOKEN not in str(info.value)
    assert "https://gateway.example.com/ray" in str(info.value)


GATEWAY_CONN_ID = "ray_gateway"


@pytest.fixture
def gateway(
    request: pytest.FixtureRequest, respx_bridge: RespxBridge, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RayHook, str, respx.MockRouter]]:
    """A hook from a connection to a dashboard behind a path prefix, the address every call must reach,
    and a fake API that answers only there (assert_all_mocked: any other address fails the call)."""
    fields, base = request.param
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{GATEWAY_CONN_ID.upper()}",
        json.dumps(
            {"conn_type": "ray", "password": RAY_TOKEN, "extra": {"retry_window_seconds": 0}, **fields}
        ),
    )
    monkeypatch.setattr(_BridgeResolver, "port", respx_bridge.port)
    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", _BridgeResolver)
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        respx_bridge.router = router
        try:
            yield RayHook(ray_conn_id=GATEWAY_CONN_ID), base, router
        finally:
            respx_bridge.router = None


GATEWAYS = [
    pytest.param(({"host": "http://ray.test/ray"}, "http://ray.test/ray"), id="prefix"),
    pytest.param(({"host": "http://ray.test/ray/"}, "http://ray.test/ray"), id="prefix-slash"),
    pytest.param(
        ({"host": "http://ray.test/ray", "port": 8080}, "http://ray.test:8080/ray"), id="port-field"
    ),
    pytest.param(
        ({"host": "http://ray.test:8080/team/ray/"}, "http://ray.test:8080/team/ray"), id="port-in-host"
    ),
    pytest.param(({"host": "ray.test/ray", "port": 8265}, "http://ray.test:8265/ray"), id="no-scheme"),
]


@pytest.mark.parametrize("gateway", GATEWAYS, indirect=True)
async def test_every_call_reaches_the_prefixed_address(
    gateway: tuple[RayHook, str, respx.MockRouter], job_payload: Any
) -> None:
    hook, base, api = gateway
    package = RayPackage(uri="gcs://_ray_pkg_0123abcd.zip", data=b"PK\x03\x04zip")
    routes = {
        "version": api.get(f"{base}/api/version").respond(json={"ray_version": "2.60.0"}),
        "nodes": api.get(f"{base}/api/v0/nodes").respond(json=nodes_payload({"CPU": 8.0})),
        "list": api.get(f"{base}/api/jobs/").respond(json=[job_payload("j1", "RUNNING")]),
        "submit": api.post(f"{base}/api/jobs/").respond(json={"submission_id": "j1"}),
        "status": api.get(f"{base}/api/jobs/j1").respond(json=job_payload("j1", "RUNNING")),
        "stop": api.post(f"{base}/api/jobs/j1/stop").respond(json={"stopped": True}),
        "logs": api.get(f"{base}/api/jobs/j1/logs").respond(json={"logs": "hi\n"}),
        "probe": api.get(f"{base}/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(404),
        "upload": api.put(f"{base}/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200),
    }

    assert hook.get_version() == {"ray_version": "2.60.0"}
    assert len(hook.get_cluster_resources().nodes) == 1
    assert [job.job_id for job in hook.list_jobs()] == ["j1"]
    assert hook.submit_job("echo hi", submission_id="j1") == "j1"
    assert hook.get_job_status("j1") == await hook.a_get_job_status("j1") == JobStatus.RUNNING
    assert hook.get_job_info("j1") == await hook.a_get_job_info("j1")
    assert hook.stop_job("j1") is await hook.a_stop_job("j1") is True
    assert hook.get_job_logs("j1") == await hook.a_get_job_logs("j1") == "hi\n"
    assert hook.upload_package(package) == package.uri
    assert hook.test_connection() == (True, f"Connected to Ray 2.60.0 at {base}.")

    for name, route in routes.items():
        assert route.called, name
        for call in route.calls:
            url = str(call.request.url)
            assert url.startswith(f"{base}/api/"), url
            assert "//" not in url.split("://", 1)[1], url
            assert call.request.headers["Authorization"] == f"Bearer {RAY_TOKEN}"
    # Sync and async twins reached the very same address.
    assert {str(call.request.url) for call in routes["status"].calls} == {f"{base}/api/jobs/j1"}
    assert routes["status"].call_count == 4
    # The "Ray job" link opens the dashboard behind the same prefix.
    assert hook.dashboard_url == base
    assert ray_job_url(hook.dashboard_url, "j1") == f"{base}/#/jobs/j1"


def test_an_https_prefix_is_kept_by_the_sync_client(
    monkeypatch: pytest.MonkeyPatch, job_payload: Any
) -> None:
    # https through the bridge would need a certificate; the async twin builds its address with the same
    # RayConnectionSettings.url, checked for the async client over http above.
    hook = RayHook(ray_conn_id="unused")
    hook._settings = RayConnectionSettings.from_connection(
        connection(host="https://gateway.example.com/ray/", password=RAY_TOKEN)
    )
    with respx.mock(assert_all_mocked=True) as api:
        route = api.get("https://gateway.example.com/ray/api/jobs/a%2Fb").respond(
            json=job_payload("a/b", "SUCCEEDED")
        )

        assert hook.get_job_status("a/b") == JobStatus.SUCCEEDED

    assert route.called
    assert hook.settings.url("/api/jobs/") == "https://gateway.example.com/ray/api/jobs/"
    assert ray_job_url(hook.dashboard_url, "j1") == "https://gateway.example.com/ray/#/jobs/j1"


# -- redirects and login pages -------------------------------------------------------------------

LOGIN = "https://sso.example.com/oauth2/login"
#: A login redirect's query carries the proxy's state (here even a token a proxy might echo): never shown.
LOGIN_LOCATION = f"{LOGIN}?rd=%2Fapi%2Fjobs%2Fj1&state=abc&token={RAY_TOKEN}"
LOGIN_PAGE = (
    "<!DOCTYPE html><html><head><title>Sign in - Example SSO</title></head>"
    "<body><form action='/oauth2/start'>...</form></body></html>"
)

#: Each call the trigger and the operator make, sync and async where both exist, and its route.
CALLS = [
    pytest.param("get_job_info", "GET", "/api/jobs/j1", id="get_job_info"),
    pytest.param("get_job_status", "GET", "/api/jobs/j1", id="get_job_status"),
    pytest.param("stop_job", "POST", "/api/jobs/j1/stop", id="stop_job"),
    pytest.param("get_job_logs", "GET", "/api/jobs/j1/logs", id="get_job_logs"),
]

PROXY_ANSWERS = [
    pytest.param(
        httpx.Response(302, headers={"Location": LOGIN_LOCATION}, text="<a href='...'>Found</a>"),
        ["302 with a redirect to " + LOGIN, "SSO", "proxy", "cookies"],
        id="302-to-login",
    ),
    pytest.param(
        httpx.Response(200, headers={"Content-Type": "text/html; charset=utf-8"}, text=LOGIN_PAGE),
        ["200 with an HTML page (text/html; charset=utf-8, titled 'Sign in - Example SSO')", "SSO", "proxy"],
        id="200-login-page",
    ),
    pytest.param(
        httpx.Response(200, text="<html><body>Please log in</body></html>"),
        ["200 with an HTML page", "SSO", "proxy"],
        id="200-html-untyped",
    ),
    pytest.param(httpx.Response(200), ["200 with an empty body instead of JSON", "proxy"], id="200-empty"),
]


@pytest.mark.parametrize(("name", "method", "path"), CALLS)
@pytest.mark.parametrize(("answer", "fragments"), PROXY_ANSWERS)
async def test_a_proxy_answer_is_a_clear_error_in_both_twins(
    hook: RayHook,
    ray_api: respx.MockRouter,
    name: str,
    method: str,
    path: str,
    answer: httpx.Response,
    fragments: list[str],
) -> None:
    route = ray_api.request(method, path).mock(return_value=answer)
    login = ray_api.get(url__startswith=LOGIN).respond(200, text=LOGIN_PAGE)

    with pytest.raises(RayUnexpectedResponseError) as sync_info:
        getattr(hook, name)("j1")
    with pytest.raises(RayUnexpectedResponseError) as async_info:
        await getattr(hook, f"a_{name}")("j1")

    for info in (sync_info, async_info):
        message = str(info.value)
        assert f"{method} {path} to {RAY_URL}{path}" in message  # the address, never the token
        for fragment in fragments:
            assert fragment in message
        assert RAY_TOKEN not in message
        assert "state=abc" not in message
        assert info.value.status_code == answer.status_code
        assert info.value.url == f"{RAY_URL}{path}"
        # A hook error the trigger turns into an error event, and not one retried as passing.
        assert isinstance(info.value, RayHookError)
        assert not isinstance(info.value, RayUnavailableError | json.JSONDecodeError)
    assert str(async_info.value) == str(sync_info.value)
    assert route.call_count == 2
    assert not login.called  # redirects are not followed: the token never goes to the SSO host


@pytest.mark.parametrize(
    ("call", "route_args", "answer"),
    [
        pytest.param(
            "list_jobs",
            ("GET", "/api/jobs/"),
            httpx.Response(302, headers={"Location": LOGIN}),
            id="list-302",
        ),
        pytest.param(
            "list_jobs", ("GET", "/api/jobs/"), httpx.Response(200, html=LOGIN_PAGE), id="list-html"
        ),
        pytest.param(
            "submit_job",
            ("POST", "/api/jobs/"),
            httpx.Response(303, headers={"Location": LOGIN}),
            id="submit-303",
        ),
        pytest.param(
            "submit_job", ("POST", "/api/jobs/"), httpx.Response(200, html=LOGIN_PAGE), id="submit-html"
        ),
        pytest.param(
            "get_version", ("GET", "/api/version"), httpx.Response(200, html=LOGIN_PAGE), id="version-html"
        ),
        pytest.param(
            "get_cluster_resources",
            ("GET", "/api/v0/nodes"),
            httpx.Response(307, headers={"Location": LOGIN}),
            id="nodes-307",
        ),
    ],
)
def test_sync_only_calls_raise_the_same_error(
    hook: RayHook, ray_api: respx.MockRouter, call: str, route_args: tuple[str, str], answer: httpx.Response
) -> None:
    ray_api.request(*route_args).mock(return_value=answer)
    args = ("echo",) if call == "submit_job" else ()

    with pytest.raises(RayUnexpectedResponseError, match="proxy") as info:
        getattr(hook, call)(*args)

    assert f"{RAY_URL}{route_args[1]}" in str(info.value)
    assert RAY_TOKEN not in str(info.value)


def test_a_redirected_package_probe_is_not_taken_for_the_package(
    hook: RayHook, ray_api: respx.MockRouter
) -> None:
    ray_api.get("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(302, headers={"Location": LOGIN})
    upload = ray_api.put("/api/packages/gcs/_ray_pkg_0123abcd.zip").respond(200)

    with pytest.raises(RayUnexpectedResponseError, match="302 with a redirect"):
        hook.upload_package(RayPackage(uri="gcs://_ray_pkg_0123abcd.zip", data=b"PK"))
    assert not upload.called


@pytest.mark.parametrize(
    "body",
    [{"detail": "not found"}, [1, 2], {"status": "EXPLODED"}],
    ids=["no-status", "a-list", "unknown-status"],
)
async def test_json_that_is_not_job_details_is_a_clear_error(
    hook: RayHook, ray_api: respx.MockRouter, body: Any
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=body)

    with pytest.raises(
        RayUnexpectedResponseError, match="GET /api/jobs/j1 to http://ray.test:8265/api/jobs/j1"
    ):
        hook.get_job_info("j1")
    with pytest.raises(
        RayUnexpectedResponseError, match="GET /api/jobs/j1 to http://ray.test:8265/api/jobs/j1"
    ):
        await hook.a_get_job_info("j1")


def test_test_connection_reports_the_proxy(hook: RayHook, ray_api: respx.MockRouter) -> None:
    ray_api.get("/api/version").respond(302, headers={"Location": LOGIN_LOCATION})

    ok, message = hook.test_connection()

    assert ok is False
    assert "SSO" in message
    assert LOGIN in message
    assert RAY_TOKEN not in message


async def test_the_trigger_reports_a_login_redirect_as_an_error_event(
    ray_conn: str, ray_api: respx.MockRouter
) -> None:
    # The trigger turns hook errors into an error event; a JSONDecodeError crashed it instead (no event).
    ray_api.get("/api/jobs/j1").respond(302, headers={"Location": LOGIN_LOCATION})
    trigger = RayJobTrigger(job_id="j1", ray_conn_id=ray_conn, poll_interval_seconds=0.01)

    events = [event.payload async for event in trigger.run()]

    assert len(events) == 1
    assert events[0]["status"] == "error"
    assert events[0]["termination_reason"] == "api_error"
    assert "SSO" in events[0]["message"]
    assert RAY_TOKEN not in events[0]["message"]
