"""When the kernel received a request, read from real sockets: a TCP connection on loopback says how long
ago its data came in; a Unix socket and a server layout inferwatch does not know say nothing, once, in the
log. The middleware under a real uvicorn and werkzeug is in tests/integration/serving/test_middleware.py."""

from __future__ import annotations

import logging
import socket
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from inferwatch.instrumentation.edge import received
from inferwatch.instrumentation.edge.received import asgi_connection, received_at, wsgi_connection

#: The receipt's time is one scheduler tick coarse (1-10 ms).
TICK = 0.011

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="TCP_INFO is Linux's")


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A client and the server's end of one TCP connection on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
    with client, served:
        yield client, served


@pytest.fixture(autouse=True)
def nothing_told_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(received, "_told", set())


def test_a_tcp_connection_says_when_its_last_data_came_in(connection) -> None:
    client, served = connection
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
    sent = time.perf_counter()
    time.sleep(0.1)
    now = time.perf_counter()
    assert received_at(served, now) == pytest.approx(sent, abs=TICK)
    # The application reading the bytes does not move it; new data does.
    served.recv(1024)
    assert received_at(served, time.perf_counter()) == pytest.approx(sent, abs=TICK)
    client.sendall(b"more")
    again = time.perf_counter()
    assert received_at(served, time.perf_counter()) == pytest.approx(again, abs=TICK)


def test_a_unix_socket_says_nothing_once(caplog: pytest.LogCaptureFixture) -> None:
    left, right = socket.socketpair()
    with left, right, caplog.at_level(logging.WARNING, "inferwatch.instrumentation"):
        left.sendall(b"x")
        assert received_at(right, time.perf_counter()) is None
        assert received_at(right, time.perf_counter()) is None
    assert [r.getMessage() for r in caplog.records] == [
        "inferwatch: the connection is not a TCP socket: requests are timed from when the middleware was "
        "called, not from when the kernel received them (a wait in the server before that is not seen)"
    ]


def test_uvicorns_layout_leads_to_the_connection(connection) -> None:
    _, served = connection
    cycle = SimpleNamespace(transport=SimpleNamespace(get_extra_info={"socket": served}.get))
    receive = SimpleNamespace(__self__=cycle)
    assert asgi_connection(receive) is served


def test_werkzeugs_environ_holds_the_connection(connection, caplog: pytest.LogCaptureFixture) -> None:
    _, served = connection
    assert wsgi_connection({"werkzeug.socket": served}) is served
    with caplog.at_level(logging.WARNING, "inferwatch.instrumentation"):
        assert wsgi_connection({"wsgi.version": (1, 0)}) is None
        assert wsgi_connection({"wsgi.version": (1, 0)}) is None
    assert len(caplog.records) == 1
    assert "the WSGI server does not hand the application its connection" in caplog.records[0].getMessage()


def test_an_unknown_layout_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    async def receive() -> dict:
        return {"type": "http.request"}

    with caplog.at_level(logging.WARNING, "inferwatch.instrumentation"):
        assert asgi_connection(receive) is None
        assert asgi_connection(receive) is None
        assert received_at(None, time.perf_counter()) is None
    assert len(caplog.records) == 1
    told = caplog.records[0].getMessage()
    assert "the ASGI server's receive channel does not lead to its connection" in told
