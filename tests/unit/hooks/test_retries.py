"""RayHook's retries: what passes (refused, reset, 5xx) is retried within the window; nothing else."""

from __future__ import annotations

import ssl
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx

import airflow_provider_raybatch.hooks.ray as ray_hook_module
from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.shared.exceptions import RayAuthError, RayHookError, RayUnavailableError

JOB = "raybatch-job-1"


@pytest.fixture
def retrying_hook(hook: RayHook, monkeypatch: pytest.MonkeyPatch) -> RayHook:
    monkeypatch.setattr(ray_hook_module, "FIRST_RETRY_WAIT_SECONDS", 0.01)
    monkeypatch.setattr(ray_hook_module, "MAX_RETRY_WAIT_SECONDS", 0.02)
    hook._settings = replace(hook.settings, retry_window_seconds=30)
    return hook


def test_get_is_retried_through_refusals_and_5xx(
    retrying_hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    answers: list[Any] = [
        httpx.ConnectError("refused"),
        httpx.Response(503, text="restarting"),
        httpx.ReadError("reset"),
        httpx.Response(200, json=job_payload(JOB, "RUNNING")),
    ]
    route = ray_api.get(f"/api/jobs/{JOB}").mock(side_effect=answers)

    assert retrying_hook.get_job_status(JOB).value == "RUNNING"
    assert route.call_count == 4


async def test_async_get_is_retried_too(
    retrying_hook: RayHook, ray_api: respx.MockRouter, job_payload: Any
) -> None:
    answers: list[Any] = [httpx.ConnectError("refused")] * 3 + [
        httpx.Response(200, json=job_payload(JOB, "SUCCEEDED"))
    ]
    route = ray_api.get(f"/api/jobs/{JOB}").mock(side_effect=answers)

    assert (await retrying_hook.a_get_job_status(JOB)).value == "SUCCEEDED"
    assert route.call_count == 4


def test_submit_is_resent_only_when_it_never_left(retrying_hook: RayHook, ray_api: respx.MockRouter) -> None:
    route = ray_api.post("/api/jobs/").mock(
        side_effect=[httpx.ConnectError("refused"), httpx.Response(200, json={"submission_id": JOB})]
    )

    assert retrying_hook.submit_job("python x.py", submission_id=JOB) == JOB
    assert route.call_count == 2


def test_submit_answered_5xx_is_not_resent(retrying_hook: RayHook, ray_api: respx.MockRouter) -> None:
    # The cluster may have created the job before failing: a blind resend could run the batch twice.
    route = ray_api.post("/api/jobs/").respond(502, text="bad gateway")

    with pytest.raises(RayUnavailableError, match="502"):
        retrying_hook.submit_job("python x.py", submission_id=JOB)
    assert route.call_count == 1


def test_auth_errors_are_not_retried(retrying_hook: RayHook, ray_api: respx.MockRouter) -> None:
    route = ray_api.get("/api/jobs/").respond(403, text="invalid token")

    with pytest.raises(RayAuthError, match="rejected the token"):
        retrying_hook.list_jobs()
    assert route.call_count == 1


def test_tls_verification_failure_is_not_retried(hook: RayHook) -> None:
    # Built by hand: respx rewrites exception chains, and httpx raises ConnectError from the ssl error.
    try:
        try:
            raise ssl.SSLCertVerificationError("certificate verify failed: unable to get local issuer")
        except ssl.SSLError as err:
            raise httpx.ConnectError("handshake failed") from err
    except httpx.ConnectError as err:
        translated = ray_hook_module._unreachable(hook.settings, err)

    assert type(translated) is RayHookError  # not RayUnavailableError: retrying cannot fix a certificate
    assert "TLS handshake with http://ray.test:8265 failed" in str(translated)
    assert "ca_bundle_path" in str(translated)


def test_refused_connection_is_retryable_even_for_a_submit(hook: RayHook) -> None:
    translated = ray_hook_module._unreachable(hook.settings, httpx.ConnectError("refused"))

    assert isinstance(translated, RayUnavailableError)
    assert translated.request_sent is False


def test_window_closes(hook: RayHook, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_hook_module, "FIRST_RETRY_WAIT_SECONDS", 0.05)
    hook._settings = replace(hook.settings, retry_window_seconds=0.3)
    route = ray_api.get("/api/jobs/").mock(side_effect=httpx.ConnectError("refused"))

    with pytest.raises(RayUnavailableError, match="unreachable: ConnectError: refused"):
        hook.list_jobs()
    assert 2 <= route.call_count <= 10


def test_hook_argument_overrides_the_connection_window(hook: RayHook, ray_api: respx.MockRouter) -> None:
    hook._settings = replace(hook.settings, retry_window_seconds=300)
    hook.retry_window_seconds = 0
    route = ray_api.get("/api/jobs/").respond(503)

    with pytest.raises(RayUnavailableError):
        hook.list_jobs()
    assert route.call_count == 1


def test_tls_context_is_built_once_per_setting_and_shared(hook: RayHook) -> None:
    """httpx would load the CA bundle for every client; hundreds of triggers share one context."""
    first = hook.settings.client_kwargs()["verify"]
    again = replace(hook.settings, headers={"X": "y"}).client_kwargs()["verify"]
    off = replace(hook.settings, verify=False).client_kwargs()["verify"]

    assert isinstance(first, ssl.SSLContext) and first is again
    assert off is not first and off.verify_mode == ssl.CERT_NONE and not off.check_hostname
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
