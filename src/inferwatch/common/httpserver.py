"""The HTTP layer of both metrics endpoints: uvicorn's HTTP/1.1 protocol (httptools) on one asyncio loop.

Chosen by measurement against cheroot, waitress and the standard library's threaded servers
(docs/benchmarks.md, "HTTP servers"): one thread serves every connection, so a thousand slow or
silent clients cost memory, not threads, and cannot hold up a scrape; TCP_NODELAY is set, so a
keep-alive or TLS scrape is not held back 40 ms by Nagle's algorithm; TLS is the standard library's.
Of uvicorn's two HTTP/1.1 parsers, httptools (llhttp, in C) takes half the CPU of h11 per request, which
matters inside a serving process, where the endpoint's CPU is taken from the model's Python thread.

What this module adds to uvicorn's protocol, none of which uvicorn does by itself, is in
:mod:`.httpconnection`: idle, request and head limits however slowly a client sends or reads, a body
still arriving never drained, pipelined requests parsed a slice at a time, a connection cap at which the
connection that waited longest gives way, TLS in the protocol, and no access log, ``Server`` header or
WebSocket hint. Here: :class:`HttpServer`, which serves an ASGI app through it, the thread it can run in
(:class:`ServerThread`) and the CPU budget of an endpoint inside a serving process (:class:`CpuBudget`).

Only uvicorn's protocol class is used (not ``uvicorn.Server``, which logs start-up lines on uvicorn's
logger, ticks ten times a second and takes over SIGINT/SIGTERM); :class:`HttpServer` runs it on a socket
bound by the caller, so that a taken port is an ``OSError`` in the caller's thread, before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Protocol

import uvicorn
from uvicorn.server import ServerState

from inferwatch.common.clock import SYSTEM_CLOCK, LoopClock
from inferwatch.common.httpconnection import Connection, Limits, Settings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_PR_SET_NAME = 15  # prctl(2)
# Loop iterations between asyncio accepting a socket and the protocol's connection_made (plain TCP).
_ACCEPT_TURNS = 4


# Sockets that a process forked from this one must not keep (:func:`not_inherited_by_forks`).
_UNFORKED: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def not_inherited_by_forks(sock: socket.socket) -> socket.socket:
    """``sock``, closed in every process forked from this one from now on (returned for chaining).

    A pre-forking server (gunicorn) forks its workers after its master started the endpoint: each worker
    would hold a copy of the listening socket, and, after the master died, keep its port (connections
    accepted into a backlog nobody serves, scrapes timing out instead of refused, a new master unable to
    bind) until the workers noticed and exited, 12-14 s; and a copy of the helper's control socket keeps
    the helper from seeing its serving process go. The child's thread that served them does not exist in
    the fork, so nothing there uses them.
    """
    _UNFORKED.add(sock)
    return sock


def _close_inherited() -> None:
    for sock in list(_UNFORKED):
        sock.close()


os.register_at_fork(after_in_child=_close_inherited)


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (a name or an address, IPv4 or IPv6; every IPv4 interface
    when ``host`` is empty); raises ``OSError`` from resolving, ``bind`` or ``listen`` unchanged."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets that do.
    sock = socket.socket(family, kind, proto)
    try:
        # Lets a restarted endpoint bind while connections of the previous one are in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class HttpServer:
    """Serves an ASGI app on a listening socket, on the running asyncio loop (:meth:`start`/:meth:`stop`).

    ``ssl_context`` makes it HTTPS; :meth:`replace_ssl_context` swaps it for new connections without
    closing the socket (no moment without a listener).
    """

    def __init__(
        self,
        app: App,
        sock: socket.socket,
        logger: logging.Logger,
        *,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self._sock = sock
        self._port: int = sock.getsockname()[1]
        self._app = app
        self._config = uvicorn.Config(
            self._guarded,
            http="httptools",
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # uvicorn must not configure logging in a process that is not its own
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=self.limits.idle_timeout,  # type: ignore[arg-type]
        )
        self._config.load()
        self._state = ServerState()
        self._settings = Settings(self.limits, self.limits.connection_cap(), logger, ssl_context)
        self._listener: asyncio.Server | None = None

    @property
    def port(self) -> int:
        return self._port

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._app(scope, receive, send)
        except asyncio.CancelledError:
            # stop() cancels what still waits (for a CPU budget, a password check) once its connection
            # is cut: nothing to answer, and nothing for uvicorn to log as an error.
            if not self._settings.stopping:
                raise

    def _create(self, **kwargs: Any) -> Connection:
        return Connection(
            config=self._config,
            server_state=self._state,
            app_state={},
            settings=self._settings,
            **kwargs,
        )

    async def start(self) -> None:
        # A duplicate of the socket: closing this listener leaves the socket (and the port) held. TLS is
        # the protocol's (a handshake is part of a connection's time, and counts against the cap).
        self._listener = await asyncio.get_running_loop().create_server(
            self._create, sock=self._sock.dup(), backlog=self.limits.backlog
        )

    async def replace_ssl_context(self, context: ssl.SSLContext | None) -> None:
        """New connections get ``context`` (None: plain HTTP); open ones keep theirs."""
        self._settings.ssl_context = context

    async def stop(self) -> None:
        """Stop accepting, let in-flight responses finish within the grace period, cut every connection,
        and release the port."""
        self._settings.stopping = True
        if self._listener is not None:
            self._stop_accepting(self._listener)
            await self._settle()
        for connection in list(self._state.connections):
            connection.shutdown()
        deadline = time.monotonic() + self.limits.shutdown_grace
        while self._state.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in [*self._state.connections, *self._settings.handshaking]:
            connection.abort()
        await asyncio.sleep(0)  # connection_lost marks each cycle disconnected before its task is cancelled
        for task in list(self._state.tasks):
            task.cancel()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._sock.close()
        await asyncio.sleep(0)  # let the transports close their sockets before the loop may end

    @staticmethod
    def _stop_accepting(listener: asyncio.Server) -> None:
        # Not listener.close() yet: a connection accepted a moment before would find its server closed
        # when it gets its transport, fail there, and leave its socket open until garbage collection.
        loop = asyncio.get_running_loop()
        for sock in listener.sockets:
            loop.remove_reader(sock.fileno())

    @staticmethod
    async def _settle() -> None:
        """Let connections accepted a moment ago reach connection_made (a few loop turns for plain TCP)."""
        for _ in range(_ACCEPT_TURNS):
            await asyncio.sleep(0)

    @property
    def connections(self) -> int:
        return len(self._state.connections)


def request_headers(scope: Scope) -> dict[str, str]:
    """An ASGI request's headers by lower-case name; repeated ones joined with commas (RFC 9110 5.3)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


async def respond(
    send: Send, status: int, headers: Iterable[tuple[str, str]], body: bytes, *, head: bool = False
) -> None:
    """An ASGI response with ``Content-Length``; for a HEAD request (``head``) the same headers and no
    body, whatever the server does with a body it is handed."""
    fields = [*headers, ("Content-Length", str(len(body)))]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in fields],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})


class Server(Protocol):
    """What :class:`ServerThread` runs: :class:`HttpServer`, or a server built on one."""

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ServerThread:
    """A server on an event loop of its own, in one daemon thread (for a process whose main thread is not
    ours, such as a model server)."""

    def __init__(self, server: Server, name: str) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start serving; raises what starting the server raised."""
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        await self._stop.wait()
        await self.server.stop()

    def close(self) -> None:
        """Stop serving and release the port (waits for the thread); safe to call more than once."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The thread's event loop (for ``asyncio.run_coroutine_threadsafe``), once started."""
        return self._loop


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` where the OS shows it (``top -H``, ``/proc/PID/task/*/comm``), so
    that the endpoint's thread can be found in a serving process; Linux only, best effort."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class CpuBudget:
    """A share of one core: a token bucket of CPU seconds.

    The bucket fills at ``share`` CPU seconds per second up to ``burst``, and every look drains it by the
    CPU time ``clock`` counted since the previous look, paid from what it gained since then before it is
    held to ``burst`` (CPU spent over a quiet spell at less than ``share`` leaves it full). By default
    ``clock`` is ``time.thread_time``: the CPU of the thread that uses the budget (request parsing,
    rendering, everything its loop did); a caller may count something narrower instead, such as the CPU
    its answers or renderings took. The
    seconds it fills by, and waits for, are ``wall``'s (a clock a test moves, instead of waiting).
    :meth:`acquire` waits while the bucket is empty, one waiter at a time, so a client scraping in a loop
    is slowed down instead of taking a core from the serving process; an ``urgent`` caller (a client that
    has been quiet) does not queue behind those, and may take the bucket into debt down to ``-burst``.
    """

    def __init__(
        self,
        share: float,
        burst: float,
        clock: Callable[[], float] = time.thread_time,
        wall: LoopClock = SYSTEM_CLOCK,
    ) -> None:
        if not 0 < share <= 1 or burst <= 0:
            raise ValueError(f"a CPU budget needs 0 < share <= 1 and burst > 0, got {share} and {burst}")
        self.share = share
        self.burst = burst
        self._clock = clock
        self._wall = wall
        self._tokens = burst
        self._looked = 0.0  # wall time of the previous look
        self._used: float | None = None  # read first in the thread that uses the budget
        self._lock: asyncio.Lock | None = None

    def available(self) -> bool:
        """Whether the bucket is not empty now."""
        return self._refilled() > 0

    def _refilled(self) -> float:
        self._refill()
        return self._tokens

    async def acquire(self, urgent: bool = False) -> None:
        """Return when the bucket is not empty; wait (without using CPU) while it is. ``urgent``: return
        while the bucket is above ``-burst``, whoever waits."""
        if urgent:
            while self._refilled() <= -self.burst:
                await self._wall.sleep(self.burst / 10 / self.share)
            return
        if self.available() and (self._lock is None or not self._lock.locked()):
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while not self.available():
                # Wake when a tenth of the burst has come back, not as soon as the bucket is above zero:
                # every wake-up costs CPU too, and tiny sleeps would spend the whole share on waking.
                await self._wall.sleep((self.burst / 10 - self._tokens) / self.share)

    def _refill(self) -> None:
        # What was used since the last look is paid from what the bucket gained over the same seconds,
        # and only then is the bucket held to the burst: CPU spent long before this look (the helper
        # process's idle work, counted with its whole thread) was paid back as it went. Capping first and
        # charging after put every CPU second of a quiet spell on the first request after it: a scrape
        # after 130 s of an idle helper waited 3-4 s (docs/benchmarks.md, "The first scrape after idle").
        wall, used = self._wall.monotonic(), self._clock()
        if self._used is None:
            self._looked, self._used = wall, used
        gained = (wall - self._looked) * self.share
        self._tokens = min(self.burst, self._tokens + gained - (used - self._used))
        self._looked, self._used = wall, used
