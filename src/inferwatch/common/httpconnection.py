"""One connection of the HTTP layer (:mod:`.httpserver`): uvicorn's httptools protocol with the bounds of
:class:`Limits`, none of which uvicorn sets by itself:

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
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import resource
import socket
import ssl
import struct
import termios
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


@dataclass
class Settings:
    """What every connection of one server shares."""

    limits: Limits
    cap: int  # connections at most
    logger: logging.Logger
    ssl_context: ssl.SSLContext | None = None  # for new connections; None: plain HTTP
    stopping: bool = False
    #: TLS connections whose handshake is under way, oldest first (a dict as an ordered set).
    handshaking: dict[Connection, None] = field(default_factory=dict)
    #: Pipelined requests waiting for their turn: one starts per loop iteration (:meth:`take_turn`).
    turns: deque[Connection] = field(default_factory=deque)

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
    (:meth:`Connection.feed`): a pipelined flood waits as bytes in the kernel, not as parsed requests."""

    def __init__(self, transport: asyncio.Transport, protocol: Connection) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            # Soon, not now: uvicorn resumes from inside a response's send, not between two parses.
            self._protocol.loop.call_soon(self._protocol.feed)


class Connection(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :class:`Limits` (see the module docstring)."""

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
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
        # The next pipelined request waits for its turn (Settings.take_turn) instead of starting now.
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
