"""The hook through what sits between Airflow and a real Ray head: TLS (a private CA) and outages.

A proxy on loopback terminates TLS in front of the real dashboard, or refuses connections for a
while as a restarting head does; the trigger must ride the outage out within its retry window.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.shared.exceptions import RayHookError, RayUnavailableError
from airflow_provider_raybatch.triggers.ray import RayJobTrigger
from tests.conftest import DASHBOARD_PORT, cluster_ray_version
from tests.integration.proxy import TcpProxy, make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _connection(token: str, port: int, scheme: str = "http", **extra) -> str:
    return json.dumps(
        {"conn_type": "ray", "host": f"{scheme}://127.0.0.1", "port": port, "password": token, "extra": extra}
    )


@pytest.fixture(scope="module")
def tls_proxy(ray_cluster, tmp_path_factory):
    tls = make_tls_files(tmp_path_factory.mktemp("tls"))
    proxy = TcpProxy(DASHBOARD_PORT, tls=tls).start()
    yield proxy, tls
    proxy.stop()


def test_tls_with_the_clusters_ca_bundle(ray_cluster, tls_proxy, monkeypatch) -> None:
    proxy, tls = tls_proxy
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_TLS",
        _connection(ray_cluster.token, proxy.port, "https", ca_bundle_path=str(tls.ca_pem)),
    )

    ok, message = RayHook(ray_conn_id="ray_tls").test_connection()

    assert ok, message
    assert message.startswith(f"Connected to Ray {cluster_ray_version()} at https://127.0.0.1:")


def test_tls_against_an_unknown_ca_fails_at_once_with_a_clear_message(
    ray_cluster, tls_proxy, monkeypatch
) -> None:
    proxy, _ = tls_proxy
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TLS", _connection(ray_cluster.token, proxy.port, "https"))

    started = time.monotonic()
    with pytest.raises(RayHookError, match="TLS handshake with https://127.0.0.1:.* failed") as raised:
        RayHook(ray_conn_id="ray_tls").list_jobs()

    assert not isinstance(raised.value, RayUnavailableError)
    assert time.monotonic() - started < 5  # not retried for the 300 s window
    assert ray_cluster.token not in str(raised.value)


def test_tls_verification_switched_off(ray_cluster, tls_proxy, monkeypatch) -> None:
    proxy, _ = tls_proxy
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_TLS", _connection(ray_cluster.token, proxy.port, "https", verify=False)
    )

    assert RayHook(ray_conn_id="ray_tls").get_version()["ray_version"] == cluster_ray_version()


@pytest.mark.parametrize("extra", ["ca_bundle", "verify_off"])
async def test_async_twin_over_tls(ray_cluster, tls_proxy, monkeypatch, extra: str) -> None:
    # The async twin has its own client (aiohttp): the same TLS settings must reach it.
    proxy, tls = tls_proxy
    settings = {"ca_bundle_path": str(tls.ca_pem)} if extra == "ca_bundle" else {"verify": False}
    env = _connection(ray_cluster.token, proxy.port, "https", **settings)
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TLS", env)
    hook = RayHook(ray_conn_id="ray_tls")
    job_id = hook.submit_job("python -c 'pass'", submission_id=f"live-tls-{uuid.uuid4().hex[:8]}")

    info = await hook.a_get_job_info(job_id)

    assert info.job_id == job_id


async def test_async_twin_against_an_unknown_ca_fails_at_once(ray_cluster, tls_proxy, monkeypatch) -> None:
    proxy, _ = tls_proxy
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TLS", _connection(ray_cluster.token, proxy.port, "https"))

    started = time.monotonic()
    with pytest.raises(RayHookError, match="TLS handshake with https://127.0.0.1:.* failed") as raised:
        await RayHook(ray_conn_id="ray_tls").a_get_job_info("any-job")

    assert not isinstance(raised.value, RayUnavailableError)
    assert time.monotonic() - started < 5  # not retried for the 300 s window
    assert ray_cluster.token not in str(raised.value)


async def test_trigger_rides_out_a_dashboard_outage(ray_cluster, monkeypatch, capsys) -> None:
    proxy = TcpProxy(DASHBOARD_PORT).start()
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_PROXIED", _connection(ray_cluster.token, proxy.port, retry_window_seconds=60)
    )
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    job_id = RayHook().submit_job("sleep 20", submission_id=f"live-outage-{uuid.uuid4().hex[:8]}")
    trigger = RayJobTrigger(job_id=job_id, ray_conn_id="ray_proxied", poll_interval_seconds=1)

    async def outage() -> None:
        await asyncio.sleep(3)
        proxy.pause()  # refused, as while a head restarts
        await asyncio.sleep(12)
        proxy.resume()

    try:
        outage_task = asyncio.create_task(outage())
        events = [event.payload async for event in trigger.run()]
        await outage_task
    finally:
        proxy.stop()

    assert [e["status"] for e in events] == ["success"], events
    logged = "".join(capsys.readouterr())  # the hook logs through Airflow's structlog
    retries = [line for line in logged.splitlines() if "unreachable" in line and "retrying in" in line]
    assert len(retries) >= 2, logged[-2000:]  # the outage was real and was retried, not skipped
