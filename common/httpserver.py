"""The HTTP layer of both metrics endpoints: uvicorn's HTTP/1.1 protocol (httptools) on one asyncio loop.

Chosen by measurement against cheroot, waitress and the standard library's threaded servers
(docs/benchmarks.md, "HTTP servers"): one thread serves every connection, so a thousand slow or
silent clients cost memory, not threads, and cannot hold up a scrape; TCP_NODELAY is set, so a
keep-alive or TLS scrape is not held back 40 ms by Nagle's algorithm; TLS is the standard library's.
Of uvicorn's two HTTP/1.1 parsers, httptools (llhttp, in C) takes half the CPU of h11 per request, which
matters inside a serving process, where the endpoint's CPU is taken from the model's Python thread.

What this module adds to uvicorn's protocol, none of which uvicorn does by itself:

* an **idle limit** (``Limits.idle_timeout``) from the moment a connection opens, not only after a first
  response, and not ended by a stray byte (uvicorn stops its timer at any byte and arms nothing else):
  a client that connects and sends nothing, or only blank lines, is closed;
* a **request limit** (``Limits.request_timeout``): from the first byte of a request to the last byte of
  its response, however slowly the client sends its head or body or reads the answer (a slowloris, or a
  client that never reads); such a connection is aborted with a TCP reset, so that the kernel frees what
  it held for it too. An answer counts as read once the kernel's send queue is empty (``TIOCOUTQ``), not
  when asyncio has handed it over, and the kernel's send buffer is bounded (``SO_SNDBUF``);
* a request answered while its **body is still arriving** closes the connection after the answer
  instead of draining the body (a body announced as a gigabyte is never waited for);
* **pipelined requests are parsed one slice at a time** (1 KiB), and only while no request waits behind
  the one being answered: a flood of pipelined requests waits as bytes in the kernel (reads of 16 KiB at
  most), not as thousands of parsed requests, so a connection's memory is bounded whatever it sends;
* a **connection cap** (``Limits.max_connections``, below the process's file-descriptor limit), so that a
  flood of connections cannot take the descriptors NVML and /proc reads need; at the cap, the
  connection that has gone longest without an answer gives way to the new one (a slow head or body, a
  silent client), so that a new scrape is never the one refused;
* **TLS in the protocol**, not the listener: a handshake is part of a connection's time, counts against
  the cap, is bounded by the request limit, and at most 128 run at once (the oldest gives way), each
  holding asyncio's 256 KiB TLS buffer;
* a **request-head limit** (``Limits.max_head_bytes``), measured on the head to within a slice: llhttp
  itself has none;
* no access log, no ``Server`` header, no WebSocket-library hint for an ``Upgrade`` request (answered as
  plain HTTP, then closed), and uvicorn's per-connection messages on the caller's logger instead of
  ``uvicorn.error``: inside a serving process that runs uvicorn itself, the metrics endpoint must not
  write into its access log nor change its loggers.

Only uvicorn's protocol class is used (not ``uvicorn.Server``, which logs start-up lines on uvicorn's
logger, ticks ten times a second and takes over SIGINT/SIGTERM); :class:`HttpServer` runs it on a socket
bound by the caller, so that a taken port is an ``OSError`` in the caller's thread, before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import resource
import socket
import ssl
import struct
import termios
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import uvicorn
from inferwatch.common.clock import SYSTEM_CLOCK, LoopClock
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_PR_SET_NAME = 15  # prctl(2)
# Loop iterations between asyncio accepting a socket and the protocol's connection_made (plain TCP).
_ACCEPT_TURNS = 4
# Descriptors kept out of reach of HTTP clients: NVML, /proc reads, log files, the listening socket.
_RESERVED_FDS = 64
# Bytes parsed at a time: a request head is measured to within this, and a pipelined request stays bytes
# (not a parsed request, ~2 KB) until the one before it is answered.
_FEED_BYTES = 1024
# Bytes read from a plain connection at once (asyncio's default, 256 KiB, is what one connection could make
# the server hold unparsed); the client's further bytes wait in the kernel.
_READ_BYTES = 16 * 1024
# The kernel's send buffer of a connection (it doubles the figure): a scrape's answer (tens of KB) fits,
# and a client that does not read holds this much kernel memory, not tcp_wmem's 4 MiB.
_SEND_BUFFER = 128 * 1024
# TLS handshakes under way at once, at most: each holds asyncio's 256 KiB TLS read buffer. Beyond, the
# oldest gives way: a real client finishes its handshake in milliseconds.
_MAX_HANDSHAKES = 128


@dataclass(frozen=True)
class Limits:
    """How long and how many; the defaults suit a scrape endpoint (docs/exporter.md, "HTTP")."""

    #: Seconds a connection may stay open with no request in progress (fresh or kept alive).
    idle_timeout: float = 30.0
    #: Seconds from a request's first byte to the last byte of its response (Prometheus' default scrape
    #: timeout is 10 s: a request that takes longer has already failed at the scraper).
    request_timeout: float = 10.0
    #: Open connections at most (also kept below the file-descriptor limit); beyond, new ones are closed.
    max_connections: int = 1024
    #: Listen backlog: connections the kernel queues while the loop is busy.
    backlog: int = 1024
    #: Bytes of a request head buffered before it is complete, at most (answered 400 beyond).
    max_head_bytes: int = 16 * 1024
    #: Seconds in-flight responses get to finish when the server stops, before their connections are cut.
    shutdown_grace: float = 0.5

    def connection_cap(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - _RESERVED_FDS))


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


@dataclass
class _Settings:
    """What every connection of one server shares."""

    limits: Limits
    cap: int  # connections at most
    logger: logging.Logger
    ssl_context: ssl.SSLContext | None = None  # for new connections; None: plain HTTP
    stopping: bool = False
    #: TLS connections whose handshake is under way, oldest first (a dict as an ordered set).
    handshaking: dict[_Protocol, None] = field(default_factory=dict)
    #: Pipelined requests waiting for their turn: one starts per loop iteration (:meth:`take_turn`).
    turns: deque[_Protocol] = field(default_factory=deque)

    def take_turn(self) -> None:
        """Start the request of the next connection in :attr:`turns`, and call again at the next loop
        iteration while any wait. Every request that did not queue behind another on its connection (a
        scrape) is taken up within the iteration it arrived in, so a few clients pipelining flat out
        delay it by one answer, not by one answer each."""
        while self.turns:
            connection = self.turns.popleft()
            if connection.start_turn():
                break
        if self.turns:
            asyncio.get_running_loop().call_soon(self.take_turn)


class _Flow(FlowControl):
    """uvicorn's flow control, except that reading resumes only once the bytes already received are parsed
    (:meth:`_Protocol.feed`): a pipelined flood waits as bytes in the kernel, not as parsed requests."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            # Soon, not now: uvicorn resumes from inside a response's send, not between two parses.
            self._protocol.loop.call_soon(self._protocol.feed)


class _Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`Limits` (see the module docstring)."""

    def __init__(self, *args: Any, settings: _Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = settings.logger
        self.access_log = False
        self._settings = settings
        self._limits = settings.limits
        self._raw: asyncio.Transport | None = None  # the TCP transport, under TLS too
        self._request_deadline: asyncio.TimerHandle | None = None
        self._drain_deadline: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None  # bytes of a request head being received, None between heads
        self._pending = bytearray()  # received, not yet parsed
        self._handshake_task: asyncio.Task[None] | None = None
        self._turn: tuple[Any, Any] | None = None  # a pipelined request's cycle and app, waiting its turn
        self.since = time.monotonic()  # when it opened or last finished an answer: its claim to stay

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Headers and body go out in separate writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK (~40 ms). asyncio sets it too, but only on sockets made with IPPROTO_TCP.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # The kernel's share of an answer a client does not read: without a bound it grows to
            # tcp_wmem's maximum (4 MiB) per connection, and is not counted as pending by asyncio.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        if hasattr(transport, "max_size"):  # a plain TCP transport: bytes read at once, at most
            transport.max_size = _READ_BYTES  # type: ignore[attr-defined]
        if self._settings.stopping:  # accepted just before the listener closed
            _reset(transport)
            return
        self._make_room()
        context = self._settings.ssl_context
        if context is None:
            self._serve(transport)
            return
        self._settings.handshaking[self] = None
        # Held here: the loop keeps only a weak reference to a task.
        self._handshake_task = self.loop.create_task(self._handshake(transport, context))

    async def _handshake(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        # TLS here rather than in the listener, so that a connection counts (and can be made to give way)
        # from its first moment, not only once a client has finished its handshake.
        if transport.is_closing():  # cut to make room before this task ran
            return
        try:
            tls = await self.loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=self._limits.request_timeout
            )
        except OSError:  # timed out, refused, reset, or cut to make room
            _reset(transport)
            return
        finally:
            self._settings.handshaking.pop(self, None)
        if tls is None or tls.is_closing() or self._settings.stopping:
            _reset(transport)
            return
        self._serve(tls)

    def _serve(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self.flow = _Flow(transport, self)
        # uvicorn arms its keep-alive timer only after a response; a connection that never sends a
        # request is idle too.
        self.timeout_keep_alive_task = self.loop.call_later(
            self._limits.idle_timeout, self.timeout_keep_alive_handler
        )
        self.feed()

    def _make_room(self) -> None:
        """At the cap, the connection that has gone longest without an answer (opened or last answered
        earliest: slow heads and bodies, silent clients) is cut for this one, so that a new scrape is
        never refused for the sake of clients that get nothing done; at the handshake cap, likewise the
        oldest handshake."""
        handshaking = self._settings.handshaking
        if self._settings.ssl_context is not None and len(handshaking) >= _MAX_HANDSHAKES:
            next(iter(handshaking)).abort()
        open_ = [*self.connections, *handshaking]
        if len(open_) >= self._settings.cap:
            self.logger.warning(
                "%d connections open: closing the one that waited longest for an answer", len(open_)
            )
            min(open_, key=lambda connection: connection.since).abort()

    def abort(self) -> None:
        """Cut the connection at once, its buffers (the kernel's too) freed."""
        # Out of the counts now, not when the loop gets to connection_lost: the next newcomer in this
        # loop iteration must find another connection to cut.
        self.connections.discard(self)
        self._settings.handshaking.pop(self, None)
        if self._raw is not None:
            _reset(self._raw)

    def data_received(self, data: bytes) -> None:
        self._pending += data
        if self.flow is not None:  # else a request came with the end of the TLS handshake: fed by _serve
            self.feed()

    def feed(self) -> None:
        """Parse what was received, a slice at a time, while no request waits for the one before it: a
        pipelined request stays bytes until its turn, and the head limit counts a head to within a slice."""
        while self._pending and not self._waiting() and not self.transport.is_closing():
            chunk = bytes(self._pending[:_FEED_BYTES])
            del self._pending[:_FEED_BYTES]
            super().data_received(chunk)
            if self._head_bytes is not None and not self.transport.is_closing():
                # llhttp itself sets no limit on a request head.
                self._head_bytes += len(chunk)
                if self._head_bytes > self._limits.max_head_bytes:
                    self.logger.warning(
                        "request head over %d bytes: answered 400", self._limits.max_head_bytes
                    )
                    self.send_400_response("Request head too large")
        if self.transport.is_closing():
            self._pending.clear()
        elif self._pending or self._waiting():
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _waiting(self) -> bool:
        """Whether parsing waits: a request is queued behind the one being answered, or uvicorn holds
        reading back (a body the app has not taken)."""
        return bool(self.pipeline) or self._turn is not None or self.flow.read_paused

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn ends the idle spell at any byte (a lone CRLF, a head's first byte) and arms nothing in
        # its place; here it ends when a request begins, and the request's deadline takes over.
        pass

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn logs a hint to install a WebSocket library; an endpoint that serves none answers the
        # request as plain HTTP, and closes the connection after it (the parser takes what follows for
        # the other protocol).
        self.logger.debug("Upgrade request answered as plain HTTP")
        self._pending.clear()
        if self.cycle is not None:
            self.cycle.keep_alive = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._cancel_idle()
        self._head_bytes = 0
        if self._request_deadline is None:
            self._request_deadline = self.loop.call_later(self._limits.request_timeout, self._too_slow)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._cancel_request_deadline()
        self._cancel_idle()
        self.since = time.monotonic()
        if self.cycle.more_body and not self.transport.is_closing():
            # Answered while its body is still coming: closed rather than drained (a body announced
            # as a gigabyte and never sent would hold the connection for ever).
            self._pending.clear()
            self.transport.close()
        # The answer is complete once handed over; a client that does not take it keeps it in buffers
        # (asyncio's, and the kernel's, which asyncio does not count), until this deadline.
        if self._drain_deadline is not None:
            self._drain_deadline.cancel()
        self._drain_deadline = None
        if self._unsent():
            self._drain_deadline = self.loop.call_later(self._limits.request_timeout, self._not_drained)
        # The next pipelined request waits for its turn (_Settings.take_turn) instead of starting now.
        self._turn = self.pipeline.pop() if self.pipeline else None
        if self._turn is not None:
            turns = self._settings.turns
            turns.append(self)
            if len(turns) == 1:
                self.loop.call_soon(self._settings.take_turn)
        queued, self.pipeline = self.pipeline, deque()
        super().on_response_complete()  # with no pipeline to start from: uvicorn would start the next now
        self.pipeline = queued
        if self._turn is not None:
            self._cancel_idle()  # uvicorn saw no pipelined request and armed it
        # A pipelined request, queued, being answered or partly received, runs on a deadline of its own.
        pending = self._turn or self.pipeline or self._head_bytes is not None or self._pending
        if pending and not self.transport.is_closing():
            self._request_deadline = self.loop.call_later(self._limits.request_timeout, self._too_slow)
        self.loop.call_soon(self.feed)

    def start_turn(self) -> bool:
        """Start the pipelined request that waits for its turn; False if there is none any more."""
        turn, self._turn = self._turn, None
        if turn is None or self.transport.is_closing():
            return False
        self._start_asgi_task(*turn)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._turn = None
        self._cancel_request_deadline()
        if self._drain_deadline is not None:
            self._drain_deadline.cancel()
        self._pending.clear()
        self._settings.handshaking.pop(self, None)
        if self.transport is not None:  # else cut before its TLS handshake began: uvicorn never saw it
            super().connection_lost(exc)

    def timeout_keep_alive_handler(self) -> None:
        self.abort()  # close() would wait for unsent bytes forever if the client does not read

    def shutdown(self) -> None:
        super().shutdown()
        self._cancel_request_deadline()

    def _too_slow(self) -> None:
        self._request_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        self.abort()

    def _unsent(self) -> int:
        """Bytes of answers not yet taken by the client: in asyncio's buffer and in the kernel's."""
        queued = self.transport.get_write_buffer_size()
        sock = self._raw.get_extra_info("socket") if self._raw is not None else None
        if sock is not None and sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        return queued

    def _not_drained(self) -> None:
        self._drain_deadline = None
        if self._unsent():
            self.abort()

    def _cancel_idle(self) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def _cancel_request_deadline(self) -> None:
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None


def _reset(transport: asyncio.BaseTransport) -> None:
    """Abort ``transport`` with a TCP reset: the kernel drops what it still holds to send at once, instead
    of keeping it for an orphaned socket that may never be read."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


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
        self._settings = _Settings(self.limits, self.limits.connection_cap(), logger, ssl_context)
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

    def _create(self, **kwargs: Any) -> _Protocol:
        return _Protocol(
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
        _name_os_thread(self._thread.name)
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


def _name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` where the OS shows it (``top -H``, ``/proc/PID/task/*/comm``), so
    that the endpoint's thread can be found in a serving process; Linux only, best effort."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class CpuBudget:
    """A share of one core: a token bucket of CPU seconds.

    The bucket fills at ``share`` CPU seconds per second up to ``burst``, and every look drains it by the
    CPU time ``clock`` counted since the previous look. By default ``clock`` is ``time.thread_time``: the
    CPU of the thread that uses the budget (request parsing, rendering, everything its loop did); a
    caller may count something narrower instead, such as the CPU its answers or renderings took. The
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
        wall, used = self._wall.monotonic(), self._clock()
        if self._used is None:
            self._looked, self._used = wall, used
        self._tokens = min(self.burst, self._tokens + (wall - self._looked) * self.share) - (
            used - self._used
        )
        self._looked, self._used = wall, used
