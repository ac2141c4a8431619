"""ASGI and WSGI middleware at the HTTP edge of a serving process::

    app.add_middleware(ArrivalMiddleware)               # FastAPI / Starlette
    app.wsgi_app = WSGIArrivalMiddleware(app.wsgi_app)  # Flask

Each HTTP request opens an :class:`~inferwatch.instrumentation.timing.arrival.Arrival` as the server receives
it, so the ``generate`` it runs is timed from there (TTFT, end-to-end latency and queue time as the user waits
them), also when ``generate`` runs in a worker thread. Under uvicorn and werkzeug the arrival is when the
kernel received the request, before the server got to it (:mod:`.received`). The response is watched on its
way out (:mod:`.response`): the time to its first content byte and to its last byte, and a request the server
refused before any model ran. A client that goes away before its response was complete ends its request as
``cancelled`` at that moment: ASGI's ``http.disconnect`` (listened for once the application has read the
request body, and handed to the application when it asks), a WSGI response closed before it was drained.
``stop_generation_on_disconnect=True`` also stops the generation then (it changes what the server does, so it
is opt-in; ``None`` reads ``INFERWATCH_STOP_GENERATION_ON_DISCONNECT``).

Both make :func:`~inferwatch.instrumentation.timing.arrival.propagate_to_threads` active. Only HTTP requests
open an arrival (not lifespan or websocket scopes). This module does not import torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

from inferwatch.instrumentation.edge.received import asgi_connection, wsgi_connection
from inferwatch.instrumentation.edge.response import EdgeRecorder, ResponseWatch
from inferwatch.instrumentation.timing.arrival import ARRIVAL, Arrival, propagate_to_threads

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
WSGIApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]

STOP_ENV = "INFERWATCH_STOP_GENERATION_ON_DISCONNECT"


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def stop_setting_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """``INFERWATCH_STOP_GENERATION_ON_DISCONNECT``; ValueError naming it for a value that is neither."""
    value = environ.get(STOP_ENV, "").strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValueError(f"{STOP_ENV} must be 1 or 0, got {environ[STOP_ENV]!r}")
    return value in _TRUE


def _stop_setting(value: bool | None) -> bool:
    return stop_setting_from_env() if value is None else value


class _EdgeMiddleware:
    """What both middlewares are given: the application, the ``model_name`` that labels requests refused
    before any model ran (see :mod:`.response`), the ``registry`` the models' series are on (default:
    prometheus_client's), and whether a client's leaving stops its generation."""

    def __init__(
        self,
        app: ASGIApp | WSGIApp,
        *,
        model_name: str | None = None,
        registry: Any = None,
        stop_generation_on_disconnect: bool | None = None,
    ) -> None:
        self.app = app
        self._recorder = EdgeRecorder(model_name, registry)
        self._stop = _stop_setting(stop_generation_on_disconnect)
        propagate_to_threads()

    def _arrival(self, connection_of: Callable[[Any], Any], channel: Any) -> tuple[Arrival, float | None]:
        """The request's arrival: when the kernel received it where its connection says (:mod:`.received`),
        else now; and the seconds between that receipt and now."""
        called = time.perf_counter()
        recorder = self._recorder
        received = recorder.received(connection_of, channel, called)
        arrival = Arrival(called if received is None else received)
        arrival.stop_on_disconnect = self._stop
        arrival.ttft_at_first_content = True  # the response is watched: the TTFT is its first content
        source = "application" if received is None else "socket"
        arrival.on_claim = functools.partial(recorder.contained, recorder.count_arrival, source)
        return arrival, None if received is None else called - received


class ArrivalMiddleware(_EdgeMiddleware):
    """ASGI middleware: each HTTP request is an arrival for the generate calls it makes, and its response
    is watched."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        arrival, waited = self._arrival(asgi_connection, receive)
        token = ARRIVAL.set(arrival)
        exchange = _AsgiExchange(arrival, receive, send, self._recorder)
        exchange.watch.socket_wait = waited
        raised = False
        try:
            # The response body (a streaming generator) runs inside this call: the arrival stays open.
            await self.app(scope, exchange.receive, exchange.send)
        except BaseException:
            raised = True
            raise
        finally:
            await exchange.stop_listening()
            arrival.close()
            ARRIVAL.reset(token)
            self._recorder.contained(self._recorder.record, exchange.watch, scope.get("method", ""), raised)


class _AsgiExchange:
    """The receive and send channels of one request, watched: a listener for the client's disconnect
    runs from the moment the application has read the whole body (before that, reading is its own)."""

    def __init__(self, arrival: Arrival, receive: Any, send: Any, recorder: EdgeRecorder) -> None:
        self.watch = ResponseWatch(arrival)
        self._receive = receive
        self._send = send
        self._contained = recorder.contained
        self._listener: asyncio.Task | None = None

    async def receive(self) -> Any:
        if self._listener is not None:
            # Every later call gets the one message after the body (the disconnect), as a server would.
            return await asyncio.shield(self._listener)
        message = await self._receive()
        kind = message.get("type")
        if kind == "http.disconnect":
            self._contained(self.watch.gone, time.perf_counter())
        elif kind == "http.request" and not message.get("more_body", False):
            self._contained(self._start_listening)
        return message

    def _start_listening(self) -> None:
        self._listener = asyncio.ensure_future(self._listen())  # RuntimeError outside asyncio (trio)

    async def _listen(self) -> Any:
        message = await self._receive()
        if message.get("type") == "http.disconnect":
            self._contained(self.watch.gone, time.perf_counter())
        return message

    async def send(self, message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self._contained(self._started, message)
        elif kind == "http.response.body":
            body, more = message.get("body", b""), message.get("more_body", False)
            try:
                await self._send(message)
            except OSError:
                self._contained(self.watch.gone, time.perf_counter())  # ASGI 2.4: the client has gone
                raise
            self._contained(self.watch.sent, body, more, time.perf_counter())
            return
        await self._send(message)

    def _started(self, message: Any) -> None:
        content_type = ""
        for name, value in message.get("headers") or ():
            if name.lower() == b"content-type":
                content_type = value.decode("latin-1")
        self.watch.started(int(message.get("status", 0)), content_type)

    async def stop_listening(self) -> None:
        listener = self._listener
        if listener is not None and not listener.done():
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener


class WSGIArrivalMiddleware(_EdgeMiddleware):
    """WSGI middleware: each request is an arrival until its response iterable is closed (a streamed body
    is produced while the server iterates it, after the application returned); a response closed before
    it was drained is a client that went away (the server could not write to it)."""

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        arrival, waited = self._arrival(wsgi_connection, environ)
        token = ARRIVAL.set(arrival)
        watch = ResponseWatch(arrival)
        watch.socket_wait = waited
        method = environ.get("REQUEST_METHOD", "")

        def started(status: str, headers: list) -> None:
            content_type = next((value for name, value in headers if name.lower() == "content-type"), "")
            code = status.split(" ", 1)[0]
            watch.started(int(code) if code.isdigit() else 0, content_type)

        def watching_start_response(status: str, headers: list, *args: Any) -> Any:
            self._recorder.contained(started, status, headers)
            return start_response(status, headers, *args)

        try:
            body = self.app(environ, watching_start_response)
        except BaseException:
            _end(arrival, token)
            self._recorder.contained(self._recorder.record, watch, method, True)
            raise
        return _WatchedBody(body, watch, token, method, self._recorder)


class _WatchedBody:
    """The application's response iterable; closing it (as every WSGI server must) ends the arrival."""

    def __init__(
        self, body: Iterable[bytes], watch: ResponseWatch, token: Any, method: str, recorder: EdgeRecorder
    ) -> None:
        self._body = body
        self._watch = watch
        self._token = token
        self._method = method
        self._recorder = recorder
        self._raised = False

    def __iter__(self) -> Iterator[bytes]:
        watch = self._watch
        chunks = iter(self._body)
        chunk: bytes | None = None
        contained = self._recorder.contained
        while True:
            # The server asks for the next chunk once it has written the one before.
            if chunk is not None:
                contained(watch.sent, chunk, True, time.perf_counter())
            try:
                chunk = next(chunks)
            except StopIteration:
                contained(watch.sent, b"", False, time.perf_counter())
                return
            except BaseException:
                self._raised = True
                raise
            yield chunk

    def close(self) -> None:
        watch, contained = self._watch, self._recorder.contained
        try:
            # Closed before it was drained: the client could not be written to.
            contained(watch.gone, time.perf_counter())
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            _end(watch.arrival, self._token)
            contained(self._recorder.record, watch, self._method, self._raised)


def _end(arrival: Arrival, token: Any) -> None:
    arrival.close()
    try:
        ARRIVAL.reset(token)
    except ValueError:  # closed from another context than it was opened in: clear this one's
        ARRIVAL.set(None)
