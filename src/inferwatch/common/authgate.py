"""Basic auth and the web config's response headers in front of any ASGI app (:mod:`.webconfig`).

The instrumentation endpoint serves its metrics and its ``/debug/`` routes behind this gate when it is
given a web config. Checking a bcrypt hash takes tens of milliseconds, so it runs on one thread of the
gate's own, never on the event loop; credentials that passed once are remembered (:class:`BasicAuth`), and
beyond :data:`MAX_WAITING` unremembered checks at once the answer is 503, so that a flood of wrong
passwords neither queues without bound nor takes more than one core's thread from the serving process.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .httpserver import Receive, Scope, Send, request_headers, respond
from .webconfig import WebConfig

MAX_WAITING = 8
_TEXT = "text/plain; charset=utf-8"


def guarded(app: Any, web: WebConfig) -> Any:
    """``app`` behind ``web``'s basic auth (when it has users), with ``web``'s headers on every answer."""
    if web.auth is None and not web.headers:
        return app
    auth = web.auth
    pool = ThreadPoolExecutor(1, thread_name_prefix="inferwatch-bcrypt") if auth is not None else None
    waiting = 0

    async def authorized(header: str | None) -> int:
        """200, 401, or 503 while too many checks wait."""
        nonlocal waiting
        credentials = auth.credentials(header)
        if credentials is None:
            return 401
        if auth.remembered(credentials):
            return 200
        if waiting >= MAX_WAITING:
            return 503
        waiting += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(pool, auth.verify, credentials)
        finally:
            waiting -= 1
        return 200 if ok else 401

    async def gate(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        head = scope["method"] == "HEAD"
        if auth is not None:
            status = await authorized(request_headers(scope).get("authorization"))
            if status == 401:
                challenge = [("Content-Type", _TEXT), ("WWW-Authenticate", 'Basic realm="inferwatch"')]
                await respond(send, 401, [*challenge, *web.headers], b"Unauthorized\n", head=head)
                return
            if status == 503:
                busy = [("Content-Type", _TEXT), ("Retry-After", "1"), *web.headers]
                await respond(send, 503, busy, b"Too many password checks at once\n", head=head)
                return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                extra = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in web.headers]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await app(scope, receive, send_with_headers if web.headers else send)

    return gate
