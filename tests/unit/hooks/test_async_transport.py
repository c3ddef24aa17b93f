"""The async twin's transport (aiohttp) over real sockets: failures, TLS, timeouts, redirects, lifetime.

Calls go to local servers (the respx bridge of conftest, or a bare socket), never to a mock of
aiohttp, so each test runs the hook's own aiohttp code.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx

import airflow_provider_raybatch.hooks.ray as ray_hook_module
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.shared.exceptions import (
    RayHookError,
    RayUnavailableError,
    RayUnexpectedResponseError,
)

from ..conftest import RAY_TOKEN, RespxBridge


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port nothing listens on (bound, never listening: connecting is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_refused_connection_is_unavailable_and_never_sent(hook: RayHook, closed_port: int) -> None:
    hook._settings = replace(hook.settings, base_url=f"http://127.0.0.1:{closed_port}")

    with pytest.raises(RayUnavailableError, match="unreachable: ClientConnectorError") as info:
        await hook.a_get_job_info("j1")

    assert info.value.request_sent is False  # a submit could be resent safely
    assert RAY_TOKEN not in str(info.value)


async def test_connection_dropped_after_sending_is_unavailable_and_sent(
    hook: RayHook, ray_api: respx.MockRouter
) -> None:
    route = ray_api.post("/api/jobs/j1/stop").mock(side_effect=httpx.ReadError("reset"))

    with pytest.raises(RayUnavailableError, match="unreachable: ServerDisconnectedError") as info:
        await hook.a_stop_job("j1")

    assert info.value.request_sent is True  # a submit must not be resent blindly
    assert route.call_count == 1


async def test_a_get_on_a_dropped_connection_is_resent_once_by_aiohttp(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    # aiohttp resends an idempotent request once when a kept-alive connection turns out closed (RFC
    # 9112, 9.3.1); the hook's own retries come on top, for GETs only within the retry window.
    answers = [httpx.ReadError("reset"), httpx.Response(200, json=job_payload("j1", "RUNNING"))]
    route = ray_api.get("/api/jobs/j1").mock(side_effect=answers)

    assert (await hook.a_get_job_info("j1")).status.value == "RUNNING"
    assert route.call_count == 2


async def test_tls_failure_fails_at_once_without_the_token(hook: RayHook, respx_bridge: RespxBridge) -> None:
    # https:// to a plain-HTTP server: the handshake fails, as with a wrong CA, and is not retried.
    hook._settings = replace(
        hook.settings, base_url=f"https://127.0.0.1:{respx_bridge.port}", retry_window_seconds=30
    )

    with pytest.raises(RayHookError, match="TLS handshake with https://127.0.0.1") as info:
        await asyncio.wait_for(hook.a_get_job_info("j1"), timeout=10)

    assert type(info.value) is RayHookError
    assert "ca_bundle_path" in str(info.value)
    assert RAY_TOKEN not in str(info.value)


async def test_a_slow_answer_times_out_as_unavailable(hook: RayHook, ray_api: respx.MockRouter) -> None:
    hook._settings = replace(hook.settings, timeout_seconds=0.2)

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(2)
        return httpx.Response(200, json={})

    ray_api.get("/api/jobs/j1").mock(side_effect=slow)

    with pytest.raises(RayUnavailableError, match="unreachable: SocketTimeoutError"):
        await hook.a_get_job_info("j1")


async def test_redirects_are_not_followed(hook: RayHook, ray_api: respx.MockRouter) -> None:
    # As the sync client (httpx does not follow them): the token must not travel to another host.
    ray_api.post("/api/jobs/j1/stop").respond(307, headers={"Location": "http://elsewhere.test/stop"})
    elsewhere = ray_api.post(url="http://elsewhere.test/stop").respond(json={"stopped": True})

    # A redirect is an error, the same in both twins (tests/unit/hooks/test_proxies.py), never success.
    with pytest.raises(RayUnexpectedResponseError, match="307 with a redirect to http://elsewhere.test/stop"):
        await hook.a_stop_job("j1")
    with pytest.raises(RayUnexpectedResponseError, match="307 with a redirect to http://elsewhere.test/stop"):
        hook.stop_job("j1")

    assert not elsewhere.called


async def test_every_call_sends_the_connection_headers(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    hook._settings = replace(hook.settings, headers={**hook.settings.headers, "X-Ray-Tenant": "t1"})
    route = ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))

    await hook.a_get_job_info("j1")
    await hook.a_get_job_info("j1")

    for call in route.calls:
        assert call.request.headers["Authorization"] == f"Bearer {RAY_TOKEN}"
        assert call.request.headers["X-Ray-Tenant"] == "t1"


def test_the_shared_session_is_closed_with_its_loop(
    hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    ray_api.get("/api/jobs/j1").respond(json=job_payload("j1", "RUNNING"))

    async def poll() -> Any:  # Any: the loop's shared clients.
        await hook.a_get_job_info("j1")
        return ray_hook_module._ASYNC_CLIENTS[asyncio.get_running_loop()]

    clients = asyncio.run(poll())  # asyncio.run, as the triggerer runs its loop

    (shared,) = clients.values()
    assert shared.session.closed  # else aiohttp logs "Unclosed client session" at exit
