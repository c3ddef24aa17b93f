"""RayHook: the Ray Jobs REST API (submit, status, stop, logs, packages), sync and async.

It speaks HTTP with httpx rather than importing Ray, so the Airflow side stays light. Each sync
method has an ``a_`` twin beside it; both share everything but the I/O (request building,
response parsing, error translation).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from airflow.sdk import BaseHook

from airflow_provider_raybatch.exceptions import (
    RayAuthError,
    RayHookError,
    RayJobAlreadyExistsError,
    RayJobNotFoundError,
)
from airflow_provider_raybatch.utils.packaging import RayPackage

if TYPE_CHECKING:
    from airflow.sdk import Connection

DEFAULT_PORT = 8265
DEFAULT_TIMEOUT_SECONDS = 30.0


class JobStatus(str, enum.Enum):
    """Ray's job states (``ray.job_submission.JobStatus``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobInfo:
    """The parts of Ray's job details the provider uses."""

    job_id: str
    status: JobStatus
    message: str = ""
    entrypoint: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None
    driver_exit_code: int | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None

    @classmethod
    def from_api(cls, payload: dict[str, Any]) -> JobInfo:  # Any: Ray's JSON job details.
        return cls(
            job_id=payload.get("submission_id") or payload.get("job_id") or "",
            status=JobStatus(payload["status"]),
            message=payload.get("message") or "",
            entrypoint=payload.get("entrypoint") or "",
            metadata=payload.get("metadata") or {},
            error_type=payload.get("error_type"),
            driver_exit_code=payload.get("driver_exit_code"),
            start_time_ms=payload.get("start_time"),
            end_time_ms=payload.get("end_time"),
        )


@dataclass(frozen=True)
class _Request:
    """One Jobs API call, built once and sent by either the sync or the async client."""

    method: str
    path: str
    json: dict[str, Any] | None = None  # Any: JSON body.
    content: bytes | None = None
    # Statuses that are answers, not errors, for this call (e.g. 404 when probing a package).
    accepted_statuses: tuple[int, ...] = ()


@dataclass(frozen=True)
class RayConnectionSettings:
    """What an httpx client needs, read from an Airflow connection of type ``ray``."""

    base_url: str
    headers: dict[str, str]
    cookies: dict[str, str]
    verify: bool | str
    timeout_seconds: float

    @classmethod
    def from_connection(cls, conn: Connection) -> RayConnectionSettings:
        extra = conn.extra_dejson
        host = (conn.host or "127.0.0.1").rstrip("/")
        if "://" in host:
            scheme, host = host.split("://", 1)
        else:
            scheme = conn.schema or extra.get("scheme") or "http"
        base_url = f"{scheme}://{host}"
        if conn.port:
            base_url += f":{conn.port}"
        elif ":" not in host and scheme == "http":
            base_url += f":{DEFAULT_PORT}"  # https without a port means an ingress on 443
        headers = {str(k): str(v) for k, v in (extra.get("headers") or {}).items()}
        token = conn.password or extra.get("token")
        if token and not any(k.lower() == "authorization" for k in headers):
            # Ray's dashboard reads "Authorization: Bearer <token>" (ray._private.authentication).
            headers["Authorization"] = f"Bearer {token}"
        verify = extra.get("verify", True)
        if isinstance(verify, str) and verify.lower() in ("true", "false"):
            verify = verify.lower() == "true"
        return cls(
            base_url=base_url,
            headers=headers,
            cookies={str(k): str(v) for k, v in (extra.get("cookies") or {}).items()},
            verify=verify,
            timeout_seconds=float(extra.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)),
        )

    def client_kwargs(self) -> dict[str, Any]:  # Any: httpx keyword arguments.
        return {
            "base_url": self.base_url,
            "headers": self.headers,
            "cookies": self.cookies,
            "verify": self.verify,
            "timeout": self.timeout_seconds,
        }


def _job_path(job_id: str, suffix: str = "") -> str:
    return f"/api/jobs/{quote(job_id, safe='')}{suffix}"


def _raise_for_response(request: _Request, response: httpx.Response) -> None:
    """Translate an error answer into the narrowest provider exception."""
    status = response.status_code
    if status < 400 or status in request.accepted_statuses:
        return
    text = response.text.strip()
    # Ray answers errors with a whole server traceback; its last line is the one that says why.
    body = (text.splitlines() or [""])[-1][:500]
    where = f"{request.method} {request.path}"
    if status == 401:
        raise RayAuthError(
            f"Ray cluster at {response.request.url.host} requires a token ({where} -> 401). "
            "Put the cluster's token (ray start writes it to ~/.ray/auth_token) in the connection's password.",
            status_code=status,
        )
    if status == 403:
        raise RayAuthError(
            f"Ray cluster rejected the token ({where} -> 403): {body}. Check the connection's password.",
            status_code=status,
        )
    if status == 404 and request.path.startswith("/api/jobs/"):
        raise RayJobNotFoundError(f"Ray job not found ({where} -> 404): {body}", status_code=status)
    if status in (400, 500) and "already exists" in text:
        raise RayJobAlreadyExistsError(f"{where} -> {status}: {body}", status_code=status)
    raise RayHookError(f"Ray Jobs API error ({where} -> {status}): {body}", status_code=status)


def _submit_request(
    entrypoint: str,
    *,
    submission_id: str | None,
    runtime_env: dict[str, Any] | None,  # Any: Ray runtime_env values.
    metadata: dict[str, str] | None,
    entrypoint_num_cpus: float | None,
    entrypoint_num_gpus: float | None,
    entrypoint_memory: int | None,
    entrypoint_resources: dict[str, float] | None,
) -> _Request:
    body: dict[str, Any] = {"entrypoint": entrypoint}  # Any: JSON body.
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
    return _Request("POST", "/api/jobs/", json=body)


class RayHook(BaseHook):
    """Talk to a Ray cluster's Jobs API (the dashboard, port 8265 by default).

    The connection's host (optionally with ``https://``) and port locate the dashboard; its password
    is the cluster's auth token, sent as ``Authorization: Bearer``. Extras: ``headers`` (dict),
    ``cookies`` (dict), ``verify`` (true, false or a CA bundle path), ``timeout_seconds``.

    :param ray_conn_id: Airflow connection id of type ``ray``. Default ``ray_default``.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str = default_conn_name, **kwargs: Any) -> None:  # Any: BaseHook's.
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self._settings: RayConnectionSettings | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:  # Any: Airflow's form description.
        return {
            "hidden_fields": ["schema", "login"],
            "relabeling": {"host": "Ray dashboard address", "password": "Ray auth token"},
            "placeholders": {
                "host": "http://127.0.0.1 or https://ray.example.com",
                "port": str(DEFAULT_PORT),
                "extra": '{"headers": {}, "verify": true, "cookies": {}}',
            },
        }

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

    def _send(self, request: _Request) -> httpx.Response:
        try:
            with httpx.Client(**self.settings.client_kwargs()) as client:
                response = client.request(
                    request.method, request.path, json=request.json, content=request.content
                )
        except httpx.HTTPError as err:
            raise RayHookError(f"Ray Jobs API at {self.settings.base_url} unreachable: {err}") from err
        _raise_for_response(request, response)
        return response

    async def _a_send(self, request: _Request) -> httpx.Response:
        """Async version of :meth:`_send`."""
        settings = await self.a_settings()
        try:
            async with httpx.AsyncClient(**settings.client_kwargs()) as client:
                response = await client.request(
                    request.method, request.path, json=request.json, content=request.content
                )
        except httpx.HTTPError as err:
            raise RayHookError(f"Ray Jobs API at {settings.base_url} unreachable: {err}") from err
        _raise_for_response(request, response)
        return response

    # -- cluster -------------------------------------------------------------------------------

    def get_version(self) -> dict[str, Any]:  # Any: Ray's JSON.
        """Ray and Jobs API versions of the cluster (``GET /api/version``)."""
        return self._send(_Request("GET", "/api/version")).json()

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
        runtime_env: dict[str, Any] | None = None,  # Any: Ray runtime_env values.
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
        return self._send(request).json()["submission_id"]

    def get_job_info(self, job_id: str) -> JobInfo:
        """Details of one job. :raises RayJobNotFoundError: no such job."""
        return JobInfo.from_api(self._send(_Request("GET", _job_path(job_id))).json())

    async def a_get_job_info(self, job_id: str) -> JobInfo:
        """Async version of :meth:`get_job_info`."""
        return JobInfo.from_api((await self._a_send(_Request("GET", _job_path(job_id)))).json())

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.get_job_info(job_id).status

    async def a_get_job_status(self, job_id: str) -> JobStatus:
        """Async version of :meth:`get_job_status`."""
        return (await self.a_get_job_info(job_id)).status

    def list_jobs(self) -> list[JobInfo]:
        """Every job the cluster knows of."""
        return [JobInfo.from_api(item) for item in self._send(_Request("GET", "/api/jobs/")).json()]

    def stop_job(self, job_id: str) -> bool:
        """Ask Ray to stop a job; False when it had already ended."""
        return bool(self._send(_Request("POST", _job_path(job_id, "/stop"))).json().get("stopped"))

    async def a_stop_job(self, job_id: str) -> bool:
        """Async version of :meth:`stop_job`."""
        response = await self._a_send(_Request("POST", _job_path(job_id, "/stop")))
        return bool(response.json().get("stopped"))

    def get_job_logs(self, job_id: str) -> str:
        """The job driver's whole log."""
        return self._send(_Request("GET", _job_path(job_id, "/logs"))).json().get("logs", "")

    async def a_get_job_logs(self, job_id: str) -> str:
        """Async version of :meth:`get_job_logs`."""
        return (await self._a_send(_Request("GET", _job_path(job_id, "/logs")))).json().get("logs", "")

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
