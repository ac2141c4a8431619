"""ASGI and WSGI middleware that open a request's :class:`~inferwatch.instrumentation.arrival.Arrival`
as the server receives it, so the ``generate`` it runs is timed from there (TTFT, end-to-end latency
and queue time as the user waits them), also when ``generate`` runs in a worker thread::

    app.add_middleware(ArrivalMiddleware)               # FastAPI / Starlette
    app.wsgi_app = WSGIArrivalMiddleware(app.wsgi_app)  # Flask

Both make :func:`~inferwatch.instrumentation.arrival.propagate_to_threads` active. Only HTTP requests
open an arrival (not lifespan or websocket scopes). This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import Any

from .arrival import ARRIVAL, Arrival, propagate_to_threads, request_arrival

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
WSGIApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]


class ArrivalMiddleware:
    """ASGI middleware: each HTTP request is an arrival for the generate calls it makes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        propagate_to_threads()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        # The response body (a streaming generator) runs inside this call: the arrival stays open for it.
        with request_arrival():
            await self.app(scope, receive, send)


class WSGIArrivalMiddleware:
    """WSGI middleware: each request is an arrival until its response iterable is closed (a streamed body
    is produced while the server iterates it, after the application returned)."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        propagate_to_threads()

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        arrival = Arrival()
        token = ARRIVAL.set(arrival)
        try:
            body = self.app(environ, start_response)
        except BaseException:
            _end(arrival, token)
            raise
        return _ClosingBody(body, arrival, token)


class _ClosingBody:
    """The application's response iterable; closing it (as every WSGI server must) ends the arrival."""

    def __init__(self, body: Iterable[bytes], arrival: Arrival, token: Any) -> None:
        self._body = body
        self._arrival = arrival
        self._token = token

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            _end(self._arrival, self._token)


def _end(arrival: Arrival, token: Any) -> None:
    arrival.close()
    try:
        ARRIVAL.reset(token)
    except ValueError:  # closed from another context than it was opened in: clear this one's
        ARRIVAL.set(None)
