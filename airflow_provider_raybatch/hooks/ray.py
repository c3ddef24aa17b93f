"""RayHook: the Ray Jobs REST API (submit, status, stop, logs, packages), sync and async.

It speaks HTTP rather than importing Ray, so the Airflow side stays light: httpx for the sync
methods, aiohttp for their ``a_`` twins (a triggerer makes hundreds of calls a second through them,
and aiohttp's C parser needs a third of httpx's CPU per call; bench/RESULTS.md, section 3). Each sync
method has its twin beside it; both share everything but the I/O (request building, response
parsing, error translation).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import http.cookiejar
import json
import os
import re
import ssl
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import aiohttp
import httpx
import yarl
from airflow.sdk import BaseHook
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_delay
from tenacity.wait import wait_exponential_jitter

from airflow_provider_raybatch.connection_form import DEFAULT_PORT, ui_field_behaviour
from airflow_provider_raybatch.exceptions import (
    RayAuthError,
    RayHookError,
    RayJobAlreadyExistsError,
    RayJobNotFoundError,
    RayUnavailableError,
    RayUnexpectedResponseError,
)
from airflow_provider_raybatch.utils.layout import (
    CLUSTER_NODES_ENDPOINT,
    ClusterResources,
    cluster_resources_from_api,
)
from airflow_provider_raybatch.utils.packaging import RayPackage

if TYPE_CHECKING:
    from airflow.sdk import Connection

DEFAULT_TIMEOUT_SECONDS = 30.0
#: How long calls keep retrying while the Jobs API is unreachable or answers 5xx (a head restart).
DEFAULT_RETRY_WINDOW_SECONDS = 300.0
#: First and longest pause between two retries (exponential backoff with jitter in between).
FIRST_RETRY_WAIT_SECONDS = 1.0
MAX_RETRY_WAIT_SECONDS = 30.0


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
        """:raises KeyError, ValueError: not Ray's job details (no ``status``, or an unknown one)."""
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
    # Sending it twice does no harm. A submit is not: it is resent only if it never left.
    idempotent: bool = True

    def should_retry(self, err: BaseException) -> bool:
        if not isinstance(err, RayUnavailableError):
            return False
        return self.idempotent or not err.request_sent


@dataclass(frozen=True)
class _Answer:
    """An answer read whole, from the sync or the async client: the parts of it the hook uses.

    Both twins build one, so everything after the I/O (status checks, JSON decoding, their errors)
    is the same code for both.
    """

    request: _Request
    #: The address called: the dashboard's (never with credentials) and the request's path.
    url: str
    status_code: int
    content: bytes
    content_type: str = ""
    location: str | None = None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self, expected: type = object) -> Any:  # Any: JSON values.
        """The body as JSON of the ``expected`` type.

        :raises RayUnexpectedResponseError: the body is not JSON, or not of that type; a proxy's
            login page answered instead of the Jobs API (a bare JSONDecodeError would say nothing,
            and would crash a trigger instead of failing the task with a reason).
        """
        try:
            value = json.loads(self.content)
        except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError for a binary body
            raise _not_json(self) from err
        if not isinstance(value, expected):
            raise _unexpected(
                self,
                f"JSON {type(value).__name__} where Ray answers a JSON {expected.__name__}",
                "Check that the connection's host is the Ray dashboard's address (with its path prefix "
                "behind an ingress) and that the cluster runs a Ray version with the Jobs API.",
            )
        return value

    def job_info(self) -> JobInfo:
        """The body as one job's details."""
        return self._job_info(self.json(dict))

    def job_infos(self) -> list[JobInfo]:
        """The body as a list of jobs' details."""
        return [self._job_info(item) for item in self.json(list)]

    def _job_info(self, payload: Any) -> JobInfo:  # Any: one JSON value of the answer.
        try:
            return JobInfo.from_api(payload)
        except (KeyError, ValueError, TypeError, AttributeError) as err:
            raise _unexpected(
                self,
                f"JSON that is not Ray's job details ({type(err).__name__}: {err})"[:300],
                "Check that the connection's host is the Ray dashboard's address and that the cluster "
                "runs a Ray version with the Jobs API.",
            ) from err


#: What to do about an answer that a proxy in front of the dashboard gave (shared by the messages).
_PROXY_ADVICE = (
    "Most likely a proxy in front of the dashboard answered: an SSO or OAuth proxy whose session "
    "expired or was never given (renew the cookie or header in the connection's extra 'cookies' or "
    "'headers', or give it a credential that needs no login), or an ingress that serves the dashboard "
    "at another address (set the connection's host to it, path prefix included)."
)

#: An HTML page's title, to tell a login page from an error page in the message.
_HTML_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _unexpected(answer: _Answer, what: str, advice: str) -> RayUnexpectedResponseError:
    request = answer.request
    return RayUnexpectedResponseError(
        f"Ray Jobs API call {request.method} {request.path} to {answer.url} answered "
        f"{answer.status_code} with {what}. {advice}",
        status_code=answer.status_code,
        url=answer.url,
        location=answer.location,
        content_type=answer.content_type or None,
    )


def _not_json(answer: _Answer) -> RayUnexpectedResponseError:
    """The error for a body that is not JSON: an HTML page is a proxy's (or another server's)."""
    content_type = answer.content_type or "no content type"
    head = answer.content.lstrip()[:1]
    if "html" in content_type.lower() or head == b"<":
        what = f"an HTML page ({content_type}"
        title = _HTML_TITLE.search(answer.content[:65536])
        if title:
            what += f", titled {' '.join(title.group(1).decode('utf-8', 'replace').split())[:100]!r}"
        what += ") instead of JSON"
    elif not answer.content:
        what = "an empty body instead of JSON"
    else:
        what = f"{len(answer.content)} bytes of {content_type} that are not JSON"
    return _unexpected(answer, what, _PROXY_ADVICE)


def _redirected(answer: _Answer) -> RayUnexpectedResponseError:
    """The error for a 3xx: the Jobs API never redirects, so a proxy did (redirects are not followed)."""
    target = _without_secrets(urljoin(answer.url, answer.location)) if answer.location else None
    what = f"a redirect to {target}" if target else "a redirect without a Location"
    return _unexpected(
        answer,
        what,
        f"{_PROXY_ADVICE} Redirects are not followed, so the token is never sent to another address.",
    )


def _without_secrets(url: str) -> str:
    """``url`` without user info, query or fragment: a login redirect's query may carry state tokens."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) or "?"


@dataclass(frozen=True)
class RayConnectionSettings:
    """What an HTTP client needs, read from an Airflow connection of type ``ray``."""

    base_url: str
    headers: dict[str, str]
    cookies: dict[str, str]
    verify: bool | str
    timeout_seconds: float
    retry_window_seconds: float = DEFAULT_RETRY_WINDOW_SECONDS

    @classmethod
    def from_connection(cls, conn: Connection) -> RayConnectionSettings:
        extra = conn.extra_dejson
        base_url = _base_url(conn.host, conn.port, conn.schema or extra.get("scheme") or "http")
        headers = {str(k): str(v) for k, v in _json_object(extra, "headers").items()}
        token = conn.password or extra.get("token")
        if token and not any(k.lower() == "authorization" for k in headers):
            # Ray's dashboard reads "Authorization: Bearer <token>" (ray._private.authentication).
            headers["Authorization"] = f"Bearer {token}"
        return cls(
            base_url=base_url,
            headers=headers,
            cookies={str(k): str(v) for k, v in _json_object(extra, "cookies").items()},
            verify=_verify(extra),
            timeout_seconds=float(extra.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS),
            retry_window_seconds=float(
                extra["retry_window_seconds"]
                if extra.get("retry_window_seconds") is not None
                else DEFAULT_RETRY_WINDOW_SECONDS
            ),
        )

    def client_kwargs(self) -> dict[str, Any]:  # Any: httpx keyword arguments.
        """The sync client's; the async one's are built from the same settings by _session_kwargs."""
        # The connection's cookies only, and none an answer sets: the same cookies on every call, as
        # the async twin sends them (see _session_kwargs).
        jar = http.cookiejar.CookieJar(policy=_KeepNoCookies())
        cookies = httpx.Cookies(jar)
        for name, value in self.cookies.items():
            cookies.set(name, value)
        return {
            "base_url": self.base_url,
            "headers": self.headers,
            "cookies": jar,
            "verify": _ssl_context(self.verify),
            "timeout": self.timeout_seconds,
        }

    def url(self, path: str) -> str:
        """The address of one Jobs API call: the dashboard's address, its path prefix kept, and ``path``.

        Both twins call this one address (httpx would merge ``base_url`` the same way; aiohttp has
        no base URL that keeps a prefix), so a prefix cannot be kept by one and lost by the other.
        """
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")

    @property
    def host(self) -> str:
        """The dashboard's host name, for messages."""
        return urlsplit(self.base_url).hostname or self.base_url

    def client_key(self) -> tuple[Any, ...]:  # Any: hashable settings.
        """What tells two settings' clients apart (the token is in ``headers``)."""
        return (
            self.base_url,
            tuple(sorted(self.headers.items())),
            tuple(sorted(self.cookies.items())),
            self.verify,
            self.timeout_seconds,
        )


def _base_url(host: str | None, port: int | None, default_scheme: str) -> str:
    """The dashboard's address from the connection's host and port fields, without a trailing slash.

    The host is a name (``127.0.0.1``) or a URL, which may carry a port and a path prefix: a
    dashboard behind an ingress at ``https://gateway.example.com/ray/``. A bare dashboard is plain
    http on 8265, so http with neither port nor path gets 8265; https, or any path (a proxy serves
    it), means the scheme's own port unless one is given. A fragment (a dashboard page's address
    copied from the browser, ``.../#/jobs``) is dropped: it never reaches the server.

    :raises RayHookError: an address that no call could use, naming the field and the fix.
    """
    text = (host or "127.0.0.1").strip()
    scheme_in_host = "://" in text
    if not scheme_in_host:
        text = f"{default_scheme}://{text}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    # Shown in errors: the host field, less any credentials it carries.
    shown = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    if scheme not in ("http", "https"):
        where = (
            f"Connection host {shown!r} has scheme {parts.scheme!r}"
            if scheme_in_host
            # A ray:// URI's path lands in the schema field: ray://gateway/ray gives the scheme "ray".
            else f"The connection's schema field (or extra 'scheme'; a ray:// URI's path) "
            f"is {default_scheme!r}"
        )
        raise RayHookError(
            f"{where}; the Ray dashboard is reached over http or https. Set the host to a URL such as "
            "http://127.0.0.1 or https://gateway.example.com/ray (a path prefix goes in the host; in a "
            "ray:// URI, URL-encode it: ray://:TOKEN@https%3A%2F%2Fgateway.example.com%2Fray)."
        )
    if "@" in parts.netloc:
        raise RayHookError(
            f"Connection host {shown!r} carries a user name or password (user:password@); it would show "
            "in logs and links. Remove it: put the cluster's token in the connection's password, or an "
            "Authorization header in the extra 'headers'."
        )
    if parts.query:
        raise RayHookError(
            f"Connection host {shown!r} has a query string ({'?' + parts.query!r}); the dashboard's "
            "address takes none. Remove it (headers or cookies go in the connection's extras)."
        )
    try:
        url_port = parts.port
    except ValueError as err:
        raise RayHookError(
            f"Connection host {shown!r} has an invalid port: {err}. Give the port as a number, in the "
            "host (https://gateway:8443/ray) or in the connection's port field."
        ) from err
    if not parts.hostname:
        raise RayHookError(
            f"Connection host {shown!r} names no host. Set it to e.g. 127.0.0.1 or https://ray.example.com."
        )
    if port and url_port and int(port) != url_port:
        raise RayHookError(
            f"Connection host {shown!r} carries port {url_port} but the connection's port field is {port}. "
            "Leave the port field empty or make the two agree."
        )
    # One slash between segments and none at the end: calls append "/api/...".
    path = re.sub(r"/{2,}", "/", parts.path).rstrip("/")
    path = quote(path, safe="/%:@!$&'()*+,;=~")
    chosen = url_port or port
    if not chosen and scheme == "http" and not path:
        chosen = DEFAULT_PORT  # a bare dashboard; https or a path prefix means a proxy on its own port
    name = parts.hostname
    netloc = f"[{name}]" if ":" in name else name  # an IPv6 address keeps its brackets
    if chosen:
        netloc += f":{chosen}"
    return f"{scheme}://{netloc}{path}"


class _KeepNoCookies(http.cookiejar.DefaultCookiePolicy):
    """Send the cookies a client was made with; keep none that an answer sets."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:  # Any: urllib's request.
        return False


#: Most calls one shared async client has on the wire at once; the rest wait their turn.
MAX_CONCURRENT_ASYNC_CALLS = 8


@dataclass(frozen=True)
class _SharedAsyncClient:
    session: aiohttp.ClientSession
    # At most MAX_CONCURRENT_ASYNC_CALLS on the wire (the connector's limit too); a burst of hundreds
    # (a triggerer restart) waits here before it builds a single request.
    slots: asyncio.Semaphore
    # Closes the session when the loop shuts down (see _close_with_the_loop); held here because the
    # loop keeps only a weak reference to it.
    closer: AsyncIterator[None]


#: One async client per event loop and connection settings, shared by every hook in the process.
_ASYNC_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], _SharedAsyncClient]  # Any: hashable settings.
] = weakref.WeakKeyDictionary()


async def _async_client(settings: RayConnectionSettings) -> _SharedAsyncClient:
    """The running loop's client for these settings, made on first use.

    A triggerer runs hundreds of triggers in one event loop, each polling every few seconds. A client
    per call opened (and closed) a TCP connection per call, and built the client each time: most of
    the triggerer's CPU (bench/RESULTS.md, section 3). A shared client keeps a few connections alive
    and reuses them. It belongs to the loop that made it: connections cannot move between loops.
    """
    clients = _ASYNC_CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = settings.client_key()
    shared = clients.get(key)
    if shared is None or shared.session.closed:
        session = aiohttp.ClientSession(**_session_kwargs(settings))
        closer = _close_with_the_loop(session)
        shared = clients[key] = _SharedAsyncClient(
            session, asyncio.Semaphore(MAX_CONCURRENT_ASYNC_CALLS), closer
        )
        await anext(closer)
    return shared


async def _close_with_the_loop(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """Close ``session`` when its loop shuts down; started once and left suspended.

    ``asyncio.run`` (the triggerer's loop, and pytest-asyncio's) closes every async generator still
    suspended before it closes the loop. Without this, aiohttp logs "Unclosed client session" for each
    shared session at exit.
    """
    try:
        yield
    finally:
        await session.close()


def _session_kwargs(settings: RayConnectionSettings) -> dict[str, Any]:  # Any: aiohttp keyword arguments.
    """aiohttp's form of :meth:`RayConnectionSettings.client_kwargs`: same headers, cookies, TLS, timeouts."""
    headers = dict(settings.headers)
    if settings.cookies and not any(name.lower() == "cookie" for name in headers):
        # The connection's cookies only, as one header; a DummyCookieJar keeps none an answer sets.
        headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in settings.cookies.items())
    timeout = settings.timeout_seconds
    return {
        "headers": headers,
        "cookie_jar": aiohttp.DummyCookieJar(),
        "connector": aiohttp.TCPConnector(
            limit=MAX_CONCURRENT_ASYNC_CALLS, ssl=_ssl_context(settings.verify)
        ),
        # As httpx's timeout: connecting and each read may take this long, the call as a whole longer.
        "timeout": aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        ),
    }


@functools.lru_cache(maxsize=16)
def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    """One TLS context per verification setting, shared by every client of the process.

    httpx builds a new context (loading the whole CA bundle, ~30 ms of CPU) for each client it
    makes, even for http:// URLs; with hundreds of triggers polling in one triggerer that alone
    saturated the event loop (bench/RESULTS.md, section 3). A CA bundle file is read once per process.
    """
    if isinstance(verify, str):
        return ssl.create_default_context(
            **({"capath": verify} if os.path.isdir(verify) else {"cafile": verify})
        )
    return httpx.create_ssl_context(verify=verify)


def _json_object(extra: dict[str, Any], key: str) -> dict[str, Any]:  # Any: JSON values.
    """A dict extra; the connection form may hand it over as JSON text."""
    value = extra.get(key) or {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RayHookError(f"Connection extra {key!r} is not valid JSON: {err.msg}.") from err
    if not isinstance(value, dict):
        raise RayHookError(f"Connection extra {key!r} must be a JSON object, got {type(value).__name__}.")
    return value


def _verify(extra: dict[str, Any]) -> bool | str:  # Any: JSON values.
    """TLS verification: a CA bundle path if one is given, else on unless switched off."""
    if extra.get("ca_bundle_path"):
        return str(extra["ca_bundle_path"])
    verify = extra.get("verify")
    if verify is None:
        return True
    if isinstance(verify, str) and verify.lower() in ("true", "false"):
        return verify.lower() == "true"
    return verify


def _job_path(job_id: str, suffix: str = "") -> str:
    return f"/api/jobs/{quote(job_id, safe='')}{suffix}"


def _tls_failure(err: BaseException) -> bool:
    """Whether an ssl error lies anywhere in the exception's chain (httpx and aiohttp wrap it)."""
    visited: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in visited:
            continue
        if isinstance(current, ssl.SSLError | aiohttp.ClientSSLError):
            return True
        visited.add(id(current))
        pending += [current.__cause__, current.__context__]
    return False


#: Transport failures before the request left: resending cannot run anything twice.
_NEVER_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
)
#: Transport failures that pass with time (reset, dropped, timed out); the request may have left.
_PASSING = (httpx.TransportError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)


def _unreachable(settings: RayConnectionSettings, err: Exception) -> RayHookError:
    """Translate an httpx or aiohttp transport failure; only those that pass are retried."""
    message = f"Ray Jobs API at {settings.base_url} unreachable: {type(err).__name__}: {err}"
    if _tls_failure(err):  # a wrong certificate or CA does not pass with time: fail at once
        return RayHookError(
            f"TLS handshake with {settings.base_url} failed: {err}. Check the connection's CA bundle path "
            "(extra ca_bundle_path) or, for a test cluster only, switch TLS verification off."
        )
    if isinstance(err, _NEVER_SENT):
        return RayUnavailableError(message, request_sent=False)
    if isinstance(err, _PASSING) and not isinstance(err, httpx.UnsupportedProtocol):
        return RayUnavailableError(message)
    return RayHookError(message)


def _raise_for_response(response: _Answer, host: str) -> None:
    """Translate an error answer into the narrowest provider exception."""
    request = response.request
    status = response.status_code
    if status < 300 or status in request.accepted_statuses:
        return
    if status < 400:  # the Jobs API never redirects: a proxy does (and a 3xx is no success)
        raise _redirected(response)
    text = response.text.strip()
    # Ray answers errors with a whole server traceback; its last line is the one that says why.
    body = (text.splitlines() or [""])[-1][:500]
    where = f"{request.method} {request.path}"
    if status == 401:
        raise RayAuthError(
            f"Ray cluster at {host} requires a token ({where} -> 401). "
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
    if status >= 500:
        raise RayUnavailableError(f"Ray Jobs API error ({where} -> {status}): {body}", status_code=status)
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
    return _Request("POST", "/api/jobs/", json=body, idempotent=False)


class RayHook(BaseHook):
    """Talk to a Ray cluster's Jobs API (the dashboard, port 8265 by default).

    The connection's host and port locate the dashboard: a name (``127.0.0.1``, port 8265 by default)
    or a URL that may carry a port and the path prefix of an ingress (``https://gateway.example.com/ray``);
    see :func:`_base_url`. Its password is the cluster's auth token, sent as ``Authorization: Bearer``.
    Extras: ``headers`` (dict), ``cookies`` (dict), ``verify`` (true, false or a CA bundle path),
    ``timeout_seconds``. A redirect or a non-JSON page (an SSO proxy's login) raises
    :class:`~airflow_provider_raybatch.exceptions.RayUnexpectedResponseError`.

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
        **kwargs: Any,  # Any: BaseHook's.
    ) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.retry_window_seconds = retry_window_seconds
        self._settings: RayConnectionSettings | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:  # Any: Airflow's form description.
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

    def get_version(self) -> dict[str, Any]:  # Any: Ray's JSON.
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
