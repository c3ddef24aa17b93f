"""Reading a ``ray`` Airflow connection into what an HTTP client needs to reach the Ray dashboard.

The connection's fields and extras become one :class:`RayConnectionSettings`: the dashboard's base
URL (a name, or a URL that may carry a port and an ingress's path prefix), the token and headers,
cookies, TLS verification, timeouts and the retry window. Both twins of
:class:`~airflow_provider_raybatch.hooks.ray.RayHook` (httpx for the sync calls, aiohttp for the
async ones) build their clients from these same settings, so the two cannot disagree on where to
call or with what credentials. Nothing here sends a request.
"""

from __future__ import annotations

import functools
import http.cookiejar
import json
import os
import re
import ssl
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from airflow_provider_raybatch.connection_form import DEFAULT_PORT
from airflow_provider_raybatch.shared.exceptions import RayHookError
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs

if TYPE_CHECKING:
    from airflow.sdk import Connection

DEFAULT_TIMEOUT_SECONDS = 30.0
#: How long calls keep retrying while the Jobs API is unreachable or answers 5xx (a head restart).
DEFAULT_RETRY_WINDOW_SECONDS = 300.0


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

    def client_kwargs(self) -> Kwargs:
        """The sync client's; the async one's come from the same settings (async_client._session_kwargs)."""
        # The connection's cookies only, and none an answer sets: the same cookies on every call, as
        # the async twin sends them (see async_client._session_kwargs).
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

    def client_key(self) -> tuple[Hashable, ...]:
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


@functools.lru_cache(maxsize=16)
def _ssl_context(verify: bool | str) -> ssl.SSLContext:
    """One TLS context per verification setting, shared by every client of the process.

    httpx builds a new context (loading the whole CA bundle, ~30 ms of CPU) for each client it
    makes, even for http:// URLs; with hundreds of triggers polling in one triggerer that alone
    saturated the event loop (bench/RESULTS.md, section 3). A CA bundle file is read once per process.
    """
    if isinstance(verify, str) and os.path.isdir(verify):
        return ssl.create_default_context(capath=verify)
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return httpx.create_ssl_context(verify=verify)


def _json_object(extra: JsonObject, key: str) -> JsonObject:
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


def _verify(extra: JsonObject) -> bool | str:
    """TLS verification: a CA bundle path if one is given, else on unless switched off."""
    if extra.get("ca_bundle_path"):
        return str(extra["ca_bundle_path"])
    verify = extra.get("verify")
    if verify is None:
        return True
    if isinstance(verify, str) and verify.lower() in ("true", "false"):
        return verify.lower() == "true"
    return verify
