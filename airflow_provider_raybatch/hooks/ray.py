"""RayHook: the Ray Jobs REST API (submit, status, stop, logs, packages), sync and async.

It speaks HTTP rather than importing Ray, so the Airflow side stays light: httpx for the sync
methods, aiohttp for their ``a_`` twins (a triggerer makes hundreds of calls a second through them,
and aiohttp's C parser needs a third of httpx's CPU per call; bench/RESULTS.md, section 3). Each sync
method has its twin beside it; both share everything but the I/O (request building, response
parsing, error translation).

This module holds the calls, their retries and the I/O of each twin. What they share lives beside it:
reading the connection (:mod:`~airflow_provider_raybatch.hooks.connection_settings`), checking and
parsing answers (:mod:`~airflow_provider_raybatch.hooks.answers`), the job types
(:mod:`~airflow_provider_raybatch.hooks.jobs`) and the async twin's shared client
(:mod:`~airflow_provider_raybatch.hooks.async_client`). The names other code imports from here are
re-exported below, so ``from airflow_provider_raybatch.hooks.ray import ...`` keeps working.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
import yarl
from airflow.sdk import BaseHook
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_delay
from tenacity.wait import wait_exponential_jitter

from airflow_provider_raybatch.connection_form import ui_field_behaviour
from airflow_provider_raybatch.hooks.answers import (
    _PROXY_ADVICE,
    _Answer,
    _raise_for_response,
    _unexpected,
    _unreachable,
)
from airflow_provider_raybatch.hooks.answers import _Request as _Request
from airflow_provider_raybatch.hooks.async_client import _ASYNC_CLIENTS as _ASYNC_CLIENTS
from airflow_provider_raybatch.hooks.async_client import _async_client
from airflow_provider_raybatch.hooks.connection_settings import (
    DEFAULT_RETRY_WINDOW_SECONDS as DEFAULT_RETRY_WINDOW_SECONDS,
)
from airflow_provider_raybatch.hooks.connection_settings import (
    DEFAULT_TIMEOUT_SECONDS as DEFAULT_TIMEOUT_SECONDS,
)
from airflow_provider_raybatch.hooks.connection_settings import (
    RayConnectionSettings as RayConnectionSettings,
)
from airflow_provider_raybatch.hooks.jobs import JobInfo as JobInfo
from airflow_provider_raybatch.hooks.jobs import JobStatus as JobStatus
from airflow_provider_raybatch.shared.exceptions import RayHookError
from airflow_provider_raybatch.shared.json_types import ArgValue, JsonObject, RuntimeEnv
from airflow_provider_raybatch.shared.layout import (
    CLUSTER_NODES_ENDPOINT,
    ClusterResources,
    cluster_resources_from_api,
)
from airflow_provider_raybatch.shared.packaging import RayPackage

#: First and longest pause between two retries (exponential backoff with jitter in between).
FIRST_RETRY_WAIT_SECONDS = 1.0
MAX_RETRY_WAIT_SECONDS = 30.0


def _job_path(job_id: str, suffix: str = "") -> str:
    return f"/api/jobs/{quote(job_id, safe='')}{suffix}"


def _submit_request(
    entrypoint: str,
    *,
    submission_id: str | None,
    runtime_env: RuntimeEnv | None,
    metadata: dict[str, str] | None,
    entrypoint_num_cpus: float | None,
    entrypoint_num_gpus: float | None,
    entrypoint_memory: int | None,
    entrypoint_resources: dict[str, float] | None,
) -> _Request:
    body: JsonObject = {"entrypoint": entrypoint}
    optional = {
        "submission_id": submission_id,
        "runtime_env": runtime_env,
        "metadata": metadata,
        "entrypoint_num_cpus": entrypoint_num_cpus,
        "entrypoint_num_gpus": entrypoint_num_gpus,
        "entrypoint_memory": entrypoint_memory,
        "entrypoint_resources": entrypoint_resources,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return _Request("POST", "/api/jobs/", json=body, idempotent=False)


class RayHook(BaseHook):
    """Talk to a Ray cluster's Jobs API (the dashboard, port 8265 by default).

    The connection's host and port locate the dashboard: a name (``127.0.0.1``, port 8265 by default)
    or a URL that may carry a port and the path prefix of an ingress (``https://gateway.example.com/ray``);
    see :func:`~airflow_provider_raybatch.hooks.connection_settings._base_url`. Its password is the
    cluster's auth token, sent as ``Authorization: Bearer``.
    Extras: ``headers`` (dict), ``cookies`` (dict), ``verify`` (true, false or a CA bundle path),
    ``timeout_seconds``. A redirect or a non-JSON page (an SSO proxy's login) raises
    :class:`~airflow_provider_raybatch.shared.exceptions.RayUnexpectedResponseError`.

    :param ray_conn_id: Airflow connection id of type ``ray``. Default ``ray_default``.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(
        self,
        ray_conn_id: str = default_conn_name,
        retry_window_seconds: float | None = None,
        **kwargs: ArgValue,  # BaseHook's
    ) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.retry_window_seconds = retry_window_seconds
        self._settings: RayConnectionSettings | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> JsonObject:
        """The form for Airflow < 3.2; newer releases read ``ui-field-behaviour`` from the provider info."""
        return ui_field_behaviour()

    # -- settings ------------------------------------------------------------------------------

    @property
    def settings(self) -> RayConnectionSettings:
        if self._settings is None:
            self._settings = RayConnectionSettings.from_connection(self.get_connection(self.ray_conn_id))
        return self._settings

    async def a_settings(self) -> RayConnectionSettings:
        """Async version of :attr:`settings`."""
        if self._settings is None:
            conn = await self.aget_connection(self.ray_conn_id)
            self._settings = RayConnectionSettings.from_connection(conn)
        return self._settings

    @property
    def dashboard_url(self) -> str:
        return self.settings.base_url

    # -- transport -----------------------------------------------------------------------------

    def _retry_policy(self, request: _Request, settings: RayConnectionSettings) -> dict[str, Any]:
        """tenacity arguments shared by the sync and async retry loops."""
        window = (
            settings.retry_window_seconds if self.retry_window_seconds is None else self.retry_window_seconds
        )

        def log_retry(state: RetryCallState) -> None:
            err = state.outcome.exception() if state.outcome else None
            pause = state.next_action.sleep if state.next_action else 0
            self.log.warning(
                "%s (try %d; retrying in %.1f s, for up to %.0f s in all).",
                err,
                state.attempt_number,
                pause,
                window,
            )

        return {
            "retry": retry_if_exception(request.should_retry),
            "stop": stop_after_delay(max(window, 0)),
            "wait": wait_exponential_jitter(initial=FIRST_RETRY_WAIT_SECONDS, max=MAX_RETRY_WAIT_SECONDS),
            "before_sleep": log_retry,
            "reraise": True,
        }

    def _send(self, request: _Request) -> _Answer:
        settings = self.settings
        for attempt in Retrying(**self._retry_policy(request, settings)):
            with attempt:
                return self._send_once(request, settings)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _send_once(self, request: _Request, settings: RayConnectionSettings) -> _Answer:
        url = settings.url(request.path)
        try:
            with httpx.Client(**settings.client_kwargs()) as client:
                response = client.request(request.method, url, json=request.json, content=request.content)
        except httpx.HTTPError as err:
            raise _unreachable(settings, err) from err
        answer = _Answer(
            request,
            url,
            response.status_code,
            response.content,
            response.headers.get("content-type", ""),
            response.headers.get("location"),
        )
        _raise_for_response(answer, settings.host)
        return answer

    async def _a_send(self, request: _Request) -> _Answer:
        """Async version of :meth:`_send`."""
        settings = await self.a_settings()
        async for attempt in AsyncRetrying(**self._retry_policy(request, settings)):
            with attempt:
                return await self._a_send_once(request, settings)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _a_send_once(self, request: _Request, settings: RayConnectionSettings) -> _Answer:
        shared = await _async_client(settings)
        url = settings.url(request.path)
        try:
            async with (
                shared.slots,
                shared.session.request(
                    request.method,
                    # The path is quoted already (_job_path); encoded=True sends it as built, as httpx does.
                    yarl.URL(url, encoded=True),
                    json=request.json,
                    data=request.content,
                    allow_redirects=False,
                ) as response,
            ):
                answer = _Answer(
                    request,
                    url,
                    response.status,
                    await response.read(),
                    response.headers.get("Content-Type", ""),
                    response.headers.get("Location"),
                )
        except (TimeoutError, aiohttp.ClientError) as err:
            raise _unreachable(settings, err) from err
        _raise_for_response(answer, settings.host)
        return answer

    # -- cluster -------------------------------------------------------------------------------

    def get_version(self) -> JsonObject:
        """Ray and Jobs API versions of the cluster (``GET /api/version``)."""
        return self._send(_Request("GET", "/api/version")).json(dict)

    def get_cluster_resources(self) -> ClusterResources:
        """Each alive node's resources and accelerator type (the dashboard's state API)."""
        return cluster_resources_from_api(self._send(_Request("GET", CLUSTER_NODES_ENDPOINT)).json(dict))

    def test_connection(self) -> tuple[bool, str]:
        """Check reachability, authentication and the Ray version, as the Airflow UI's Test button does."""
        try:
            version = self.get_version()
            self.list_jobs()  # /api/version is open; listing jobs needs the token.
        except RayHookError as err:
            return False, str(err)
        return True, f"Connected to Ray {version.get('ray_version', '?')} at {self.settings.base_url}."

    # -- jobs ----------------------------------------------------------------------------------

    def submit_job(
        self,
        entrypoint: str,
        *,
        submission_id: str | None = None,
        runtime_env: RuntimeEnv | None = None,
        metadata: dict[str, str] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: dict[str, float] | None = None,
    ) -> str:
        """Submit a job and return its submission id.

        :raises RayJobAlreadyExistsError: a job with ``submission_id`` exists already.
        """
        request = _submit_request(
            entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata=metadata,
            entrypoint_num_cpus=entrypoint_num_cpus,
            entrypoint_num_gpus=entrypoint_num_gpus,
            entrypoint_memory=entrypoint_memory,
            entrypoint_resources=entrypoint_resources,
        )
        answer = self._send(request)
        submission_id = answer.json(dict).get("submission_id")
        if not isinstance(submission_id, str) or not submission_id:
            raise _unexpected(answer, "JSON without a submission_id", _PROXY_ADVICE)
        return submission_id

    def get_job_info(self, job_id: str) -> JobInfo:
        """Details of one job. :raises RayJobNotFoundError: no such job."""
        return self._send(_Request("GET", _job_path(job_id))).job_info()

    async def a_get_job_info(self, job_id: str) -> JobInfo:
        """Async version of :meth:`get_job_info`."""
        return (await self._a_send(_Request("GET", _job_path(job_id)))).job_info()

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.get_job_info(job_id).status

    async def a_get_job_status(self, job_id: str) -> JobStatus:
        """Async version of :meth:`get_job_status`."""
        return (await self.a_get_job_info(job_id)).status

    def list_jobs(self) -> list[JobInfo]:
        """Every job the cluster knows of."""
        return self._send(_Request("GET", "/api/jobs/")).job_infos()

    def stop_job(self, job_id: str) -> bool:
        """Ask Ray to stop a job; False when it had already ended."""
        return bool(self._send(_Request("POST", _job_path(job_id, "/stop"))).json(dict).get("stopped"))

    async def a_stop_job(self, job_id: str) -> bool:
        """Async version of :meth:`stop_job`."""
        response = await self._a_send(_Request("POST", _job_path(job_id, "/stop")))
        return bool(response.json(dict).get("stopped"))

    def get_job_logs(self, job_id: str) -> str:
        """The job driver's whole log."""
        return self._send(_Request("GET", _job_path(job_id, "/logs"))).json(dict).get("logs", "")

    async def a_get_job_logs(self, job_id: str) -> str:
        """Async version of :meth:`get_job_logs`."""
        return (await self._a_send(_Request("GET", _job_path(job_id, "/logs")))).json(dict).get("logs", "")

    def get_job_log_tail(self, job_id: str, lines: int = 40) -> str:
        """The end of a job's log for an error message; empty when the log cannot be had."""
        try:
            log = self.get_job_logs(job_id)
        except RayHookError as err:
            self.log.warning("Could not fetch the log of Ray job %s: %s", job_id, err)
            return ""
        return "\n".join(log.rstrip("\n").splitlines()[-lines:])

    # -- packages ------------------------------------------------------------------------------

    def upload_package(self, package: RayPackage) -> str:
        """Upload a zipped module unless the cluster has it already; returns its ``gcs://`` URI."""
        path = f"/api/packages/gcs/{package.name}"
        probe = self._send(_Request("GET", path, accepted_statuses=(404,)))
        if probe.status_code == 404:
            self._send(_Request("PUT", path, content=package.data))
        return package.uri
