"""Request bodies bounded before anything parses them: a 413 in OpenAI's error shape past the limit.

Starlette spools a multipart upload to disk and FastAPI reads a JSON body whole, with no limit of
their own; this ASGI middleware refuses a ``Content-Length`` over the limit at once, and stops a body
sent without one (chunked) as soon as it has passed the limit. Uploads (``POST .../v1/files``) get
``max_upload_bytes`` plus room for the multipart envelope; every other request ``max_body_bytes``.
"""

from __future__ import annotations

import json
from typing import Any

#: Room for a multipart upload's boundaries, part headers and the ``purpose`` field.
MULTIPART_ENVELOPE_BYTES = 64 * 1024

Scope = dict[str, Any]  # Any: ASGI's scope and messages are plain dicts of mixed values.
Message = dict[str, Any]


class _BodyTooLarge(Exception):
    """Raised from ``receive`` once the body passed the limit, to unwind the app's parsing."""


def _too_large_messages(limit: int) -> list[Message]:
    body = json.dumps(
        {
            "error": {
                "message": f"The request body is over this server's limit of {limit} bytes.",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
    ).encode()
    return [
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        },
        {"type": "http.response.body", "body": body},
    ]


class BodySizeLimit:
    """ASGI middleware: at most ``max_upload_bytes`` (+ envelope) for uploads, ``max_body_bytes`` else."""

    def __init__(
        self, app: Any, *, upload_path_suffix: str, max_upload_bytes: int, max_body_bytes: int
    ) -> None:  # Any: the wrapped ASGI app.
        self.app = app
        self.upload_path_suffix = upload_path_suffix
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_body_bytes

    def limit_for(self, scope: Scope) -> int:
        is_upload = scope.get("method") == "POST" and scope.get("path", "").rstrip("/").endswith(
            self.upload_path_suffix
        )
        return self.max_upload_bytes + MULTIPART_ENVELOPE_BYTES if is_upload else self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:  # Any: ASGI callables.
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > limit):
            for message in _too_large_messages(limit):
                await send(message)
            return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                return  # the app's own answer to the cut body (a 400 from its parser) is replaced
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:  # _BodyTooLarge, or what a parser made of it
            if not exceeded:
                raise
        if exceeded and not started:
            for message in _too_large_messages(limit):
                await send(message)
