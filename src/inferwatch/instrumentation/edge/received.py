"""When the kernel received a request, read from its connection: the arrival before the server saw it.

The middleware runs when the server hands it the request. A server kept from reading (an event loop that
``transformers serve --continuous-batching`` before 5.25 starves with a model thread that shares its GIL,
a CPU-bound handler, a long garbage collection; a WSGI server that serves one request at a time, busy with
another) leaves the request in the socket's buffer meanwhile, and the user waits that long too: a TTFT
measured from the middleware's call leaves it out (measured: 54-76 ms less than guidellm's under
5.17-5.24's continuous batching, docs/serving.md).

Linux keeps, per TCP connection, when data last came in (``tcpi_last_data_recv`` of ``TCP_INFO``: how long
ago, to one scheduler tick of 1-10 ms). Read as the request reaches the middleware, that is when the
request's last bytes reached the server: a client sends nothing on a connection between its request and
the end of the response (HTTP/1.1; a pipelined next request makes it later, never earlier). The middleware
opens the arrival there, and the difference is ``llm_request_socket_wait_seconds``.

Where the connection is comes from the server, and this is the one place that knows a server's layout:
uvicorn (h11 and httptools) hands each request a ``receive`` bound to its request-response cycle, which
holds the connection's asyncio transport; werkzeug's WSGI server puts the connection in the environ
(``werkzeug.socket``). Any other layout (another server, a middleware outside this one that wraps
``receive``), a Unix socket or a system without ``TCP_INFO`` times from the middleware's call, says so
once in the log, and counts it in ``llm_http_arrivals_total{source="application"}``. This module does not
import torch.
"""

from __future__ import annotations

import logging
import socket
import struct
from typing import Any

logger = logging.getLogger("inferwatch.instrumentation")

#: ``struct tcp_info`` (linux/tcp.h): ``tcpi_last_data_recv``, milliseconds, after 8 one-byte fields and
#: 11 32-bit ones (rto ... last_ack_sent).
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_OFFSET = 52
_TCP_INFO_LENGTH = _LAST_DATA_RECV_OFFSET + _LAST_DATA_RECV.size
_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux only
_INET = (socket.AF_INET, socket.AF_INET6)

#: Why a request was timed from the middleware's call, each said once per process.
_told: set[str] = set()


def asgi_connection(receive: Any) -> Any:
    """The connection's socket behind an ASGI server's ``receive``, or None where its layout is unknown."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)  # uvicorn's cycle
    get_extra_info = getattr(transport, "get_extra_info", None)
    if get_extra_info is None:
        _tell(
            f"layout:{type(getattr(receive, '__self__', receive)).__qualname__}",
            "the ASGI server's receive channel does not lead to its connection (only uvicorn's does)",
        )
        return None
    return get_extra_info("socket")


def wsgi_connection(environ: dict) -> Any:
    """The connection's socket a WSGI server put in the request's environ, or None (werkzeug's only)."""
    connection = environ.get("werkzeug.socket")
    if connection is None:
        _tell("layout:wsgi", "the WSGI server does not hand the application its connection (werkzeug's does)")
    return connection


def received_at(connection: Any, now: float) -> float | None:
    """``now`` less how long ago the kernel last received data on ``connection`` (a TCP socket on Linux),
    on ``now``'s clock; None where that is unknown (said once in the log)."""
    if connection is None:
        return None
    if _TCP_INFO is None:
        _tell("no-tcp-info", "this system has no TCP_INFO")
        return None
    if connection.family not in _INET or connection.type != socket.SOCK_STREAM:
        _tell("not-tcp", "the connection is not a TCP socket")
        return None
    try:
        info = connection.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_LENGTH)
    except OSError as exc:  # a connection the client already closed
        _tell(f"getsockopt:{exc.errno}", f"TCP_INFO could not be read ({exc})")
        return None
    if len(info) < _TCP_INFO_LENGTH:
        _tell("short-tcp-info", f"TCP_INFO has {len(info)} bytes")
        return None
    (age_ms,) = _LAST_DATA_RECV.unpack_from(info, _LAST_DATA_RECV_OFFSET)
    return now - age_ms / 1000.0


def _tell(reason: str, why: str) -> None:
    if reason in _told:
        return
    _told.add(reason)
    logger.warning(
        "inferwatch: %s: requests are timed from when the middleware was called, not from when the "
        "kernel received them (a wait in the server before that is not seen)",
        why,
    )
