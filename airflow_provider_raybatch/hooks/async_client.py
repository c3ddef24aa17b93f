"""The async twin's HTTP client: one aiohttp session per event loop and connection settings.

A triggerer runs hundreds of triggers in one event loop, so the async calls share a client (kept
alive, closed with its loop, and limited to a few calls on the wire at once) instead of making one
per call; the sync calls make a short-lived httpx client each and need none of this. It is built from
:class:`~airflow_provider_raybatch.hooks.connection_settings.RayConnectionSettings`, as the sync
client is, so both send the same headers, cookies and TLS settings.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass

import aiohttp

from airflow_provider_raybatch.hooks.connection_settings import RayConnectionSettings, _ssl_context
from airflow_provider_raybatch.shared.json_types import Kwargs

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
    asyncio.AbstractEventLoop, dict[tuple[Hashable, ...], _SharedAsyncClient]
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


def _session_kwargs(settings: RayConnectionSettings) -> Kwargs:
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
