"""Shared fixtures of the unit tests: a fake Ray dashboard (respx) and an Airflow connection to it.

The sync hook speaks httpx, which respx mocks in-process. The async twin speaks aiohttp, which respx
cannot see: its calls go over a real socket to :class:`RespxBridge`, a local aiohttp server that
answers from the same respx routes (and records the calls there), so one set of routes serves both.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import aiohttp.connector
import httpx
import pytest
import respx
from aiohttp import web

from airflow_provider_raybatch.hooks.ray import RayConnectionSettings, RayHook

RAY_URL = "http://ray.test:8265"
RAY_CONN_ID = "ray_unit"
RAY_TOKEN = "s3cr3t-t0ken-value"


#: The deployment secret the unit tests' operators sign their job ids with (jobs/deployment_secret.py).
TEST_DEPLOYMENT_SECRET = "unit-tests-deployment-secret"


@pytest.fixture(autouse=True)
def deployment_secret(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """Airflow's unit-test configuration has no fernet key: give the deployment a secret; returns its key."""
    from airflow_provider_raybatch.jobs.deployment_secret import signing_key

    monkeypatch.setenv("AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET", TEST_DEPLOYMENT_SECRET)
    return signing_key(TEST_DEPLOYMENT_SECRET)


@pytest.fixture(autouse=True)
def no_object_storage_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tests' ``s3://`` outputs exist nowhere: the operator's read of a committed manifest
    says so at once instead of asking AWS for credentials (seconds each). Local paths are read for
    real; tests/integration reads S3 for real."""
    from airflow_provider_raybatch.jobs.committed_manifest import CommittedManifest, read_committed_manifest
    from airflow_provider_raybatch.operators import job_results

    def read(output_uri: str, conn_id: str | None = None, within: str | None = None) -> CommittedManifest:
        if "://" in output_uri and not output_uri.startswith("file://"):
            return CommittedManifest(None, f"{output_uri} is not reachable from the unit tests")
        return read_committed_manifest(output_uri, conn_id, within)

    monkeypatch.setattr(job_results, "read_committed_manifest", read)


@pytest.fixture
def ray_conn(monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (from the environment) to the fake dashboard; returns its id."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{RAY_CONN_ID.upper()}",
        json.dumps(
            {
                "conn_type": "ray",
                "host": "ray.test",
                "port": 8265,
                "password": RAY_TOKEN,
                # No retries unless a test asks: a refused call should fail at once here.
                "extra": {"retry_window_seconds": 0},
            }
        ),
    )
    return RAY_CONN_ID


def nodes_payload(*node_resources: dict[str, float]) -> dict[str, Any]:  # Any: JSON values.
    """The state API's answer listing alive nodes with these total resources."""
    nodes = [
        {
            "node_id": f"node{i}",
            "is_head_node": i == 0,
            "state": "ALIVE",
            "resources_total": resources,
            "labels": {},
        }
        for i, resources in enumerate(node_resources)
    ]
    return {"result": True, "msg": "", "data": {"result": {"total": len(nodes), "result": nodes}}}


class RespxBridge:
    """A local HTTP server, in its own thread and loop, that answers each request from a respx router.

    A route whose side effect raises an httpx transport error (refused, reset) drops the connection
    without answering: what the async client then sees is a connection lost after its request left.
    """

    def __init__(self) -> None:
        self.router: respx.MockRouter | None = None
        self._loop = asyncio.new_event_loop()
        self._runner = self._loop.run_until_complete(self._start())
        self.port: int = self._runner.addresses[0][1]
        self._thread = threading.Thread(target=self._loop.run_forever, name="respx-bridge", daemon=True)
        self._thread.start()

    async def _start(self) -> web.ServerRunner:
        runner = web.ServerRunner(web.Server(self._handle))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if self.router is None:
            return web.Response(status=418, text="no fake Ray API in this test (use the ray_api fixture)")
        outgoing = httpx.Request(
            request.method,
            f"http://{request.host}{request.raw_path}",
            headers=list(request.headers.items()),
            content=await request.read(),
        )
        try:
            answer = await self.router.async_handler(outgoing)
        except httpx.TransportError:
            assert request.transport is not None
            request.transport.abort()  # the client never gets the answer below
            return web.Response(status=599)
        headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in _HOP_HEADERS]
        return web.Response(status=answer.status_code, body=answer.content, headers=headers)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection"})


class _BridgeResolver(aiohttp.ThreadedResolver):
    """DNS for the tests: the fake dashboard's host name is the bridge; other names resolve as usual."""

    port = 0

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> Any:
        if host != "ray.test":
            return await super().resolve(host, port, family)
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": self.port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]


@pytest.fixture(scope="session")
def respx_bridge() -> Iterator[RespxBridge]:
    bridge = RespxBridge()
    yield bridge
    bridge.close()


@pytest.fixture
def ray_api(respx_bridge: RespxBridge, monkeypatch: pytest.MonkeyPatch) -> Iterator[respx.MockRouter]:
    """The fake Ray Jobs API; every test adds the routes it needs.

    The sync client is mocked by respx; the async client reaches the same routes through the bridge.
    """
    monkeypatch.setattr(_BridgeResolver, "port", respx_bridge.port)
    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", _BridgeResolver)
    with respx.mock(base_url=RAY_URL, assert_all_called=False, assert_all_mocked=True) as router:
        # A roomy cluster for the operator's layout check; tests of that check replace the answer.
        router.get("/api/v0/nodes").respond(json=nodes_payload({"CPU": 64.0, "GPU": 8.0}))
        respx_bridge.router = router
        try:
            yield router
        finally:
            respx_bridge.router = None


@pytest.fixture
def hook() -> RayHook:
    """A RayHook whose settings point at the fake dashboard, without an Airflow connection."""
    ray_hook = RayHook(ray_conn_id="unused")
    ray_hook._settings = RayConnectionSettings(
        base_url=RAY_URL,
        headers={"Authorization": f"Bearer {RAY_TOKEN}"},
        cookies={},
        verify=True,
        timeout_seconds=5.0,
        retry_window_seconds=0,
    )
    return ray_hook


@pytest.fixture
def job_payload() -> Callable[..., dict[str, Any]]:
    """Ray's JSON job details for a job id and status."""

    def make(job_id: str, status: str, **extra: Any) -> dict[str, Any]:  # Any: JSON values.
        payload = {
            "type": "SUBMISSION",
            "job_id": None,
            "submission_id": job_id,
            "status": status,
            "entrypoint": "python -m airflow_provider_raybatch.pipeline --spec '{}'",
            "message": "",
            "metadata": {},
            "start_time": 1_700_000_000_000,
            "end_time": None,
        }
        payload.update(extra)
        return payload

    return make
