"""What a Jobs API call sends and what it gets back, and the provider exception for each failure.

Both twins of :class:`~airflow_provider_raybatch.hooks.ray.RayHook` build a :class:`_Request`, read
the reply whole into an :class:`_Answer`, and hand it to the code here: status codes become the
narrowest provider exception, a redirect or a page that is not JSON (an SSO proxy's login) becomes
:class:`~airflow_provider_raybatch.shared.exceptions.RayUnexpectedResponseError`, the JSON body becomes
:class:`~airflow_provider_raybatch.hooks.jobs.JobInfo`, and a transport failure (no answer at all)
becomes an error that says whether retrying can help. Kept out of the hook so that everything after
the I/O is one piece of code, which the two twins cannot each get slightly different.
"""

from __future__ import annotations

import json
import re
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp
import httpx

from airflow_provider_raybatch.hooks.jobs import JobInfo
from airflow_provider_raybatch.shared.exceptions import (
    RayAuthError,
    RayHookError,
    RayJobAlreadyExistsError,
    RayJobNotFoundError,
    RayUnavailableError,
    RayUnexpectedResponseError,
)
from airflow_provider_raybatch.shared.json_types import JsonObject, JsonValue

if TYPE_CHECKING:
    from airflow_provider_raybatch.hooks.connection_settings import RayConnectionSettings


@dataclass(frozen=True)
class _Request:
    """One Jobs API call, built once and sent by either the sync or the async client."""

    method: str
    path: str
    json: JsonObject | None = None
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

    def json(self, expected: type = object) -> JsonValue:
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

    def _job_info(self, payload: JsonValue) -> JobInfo:
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
            "Put the cluster's token (ray start writes it to ~/.ray/auth_token) "
            "in the connection's password.",
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
