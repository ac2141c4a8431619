"""The exporter's HTTP endpoint on a real socket: every path for GET and HEAD, content negotiation by
``q``, gzip only when acceptable, request bodies consumed, basic auth (any case of the scheme, long
passwords, a reload of the users), the web config's headers, and an ``OSError`` for a taken address."""

from __future__ import annotations

import asyncio
import base64
import errno
import gzip
import http.client
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from inferwatch.common.httpserver import ServerThread
from inferwatch.common.webconfig import BasicAuth, WebConfig
from inferwatch.exporter.errors import ListenError
from inferwatch.exporter.exposition import ScrapeRenderer
from inferwatch.exporter.server import ExporterServer
from tests.support import sample_value
from tests.support.certs import bcrypt_hash
from tests.unit.exporter.conftest import MakePoller

PATHS = ("/metrics", "/-/healthy", "/-/ready", "/", "/nothing")


def basic(user: str, password: str, scheme: str = "Basic") -> str:
    return f"{scheme} " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Running:
    def __init__(self, thread: ServerThread, server: ExporterServer) -> None:
        self.thread = thread
        self.server = server
        self.port = server.port

    def get(self, path: str, method: str = "GET", **headers: str) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        connection.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        response = connection.getresponse()
        response.body = response.read()  # type: ignore[attr-defined]
        connection.close()
        return response

    def apply(self, web: WebConfig) -> None:
        asyncio.run_coroutine_threadsafe(self.server.apply_web_config(web), self.thread.loop).result(10)


@pytest.fixture
def serve(make_poller: MakePoller) -> Iterator[Any]:
    threads: list[ServerThread] = []

    def start(web: WebConfig | None = None) -> Running:
        poller = make_poller()
        poller.collect()
        server = ExporterServer("127.0.0.1", 0, ScrapeRenderer(poller), poller.ready, web=web)
        thread = ServerThread(server, "exporter-http")
        thread.start()
        threads.append(thread)
        return Running(thread, server)

    yield start
    for thread in threads:
        thread.close()


def test_every_path_answers_head_like_get_without_a_body(serve: Any) -> None:
    running = serve()
    for path in PATHS:
        got, head = running.get(path), running.get(path, "HEAD")
        assert head.status == got.status, path
        assert head.body == b"" and got.body, path
        assert head.getheader("Content-Length") == got.getheader("Content-Length") == str(len(got.body))
        assert head.getheader("Content-Type") == got.getheader("Content-Type")
        assert got.getheader("Server") is None and got.version == 11
    assert running.get("/nothing").status == 404


def test_other_methods_are_refused_with_allow(serve: Any) -> None:
    response = serve().get("/metrics", "POST")
    assert response.status == 405
    assert response.getheader("Allow") == "GET, HEAD"


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),
        ("text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.9", True),
        ("application/openmetrics-text;q=0,text/plain", False),
        ("*/*", False),
    ],
)
def test_the_format_follows_the_weights(serve: Any, accept: str, openmetrics: bool) -> None:
    response = serve().get("/metrics", Accept=accept)
    assert response.getheader("Content-Type").startswith(
        "application/openmetrics-text" if openmetrics else "text/plain"
    )
    assert response.body.endswith(b"# EOF\n") is openmetrics


@pytest.mark.parametrize("accept", ["*/*;q=0", "application/openmetrics-text;q=0, text/plain;q=0, */*;q=0"])
def test_every_format_refused_is_answered_406(serve: Any, accept: str) -> None:
    running = serve()
    refused, head = running.get("/metrics", Accept=accept), running.get("/metrics", "HEAD", Accept=accept)
    assert refused.status == head.status == 406
    assert b"text/plain, application/openmetrics-text" in refused.body and head.body == b""
    # The text format refused, the rest accepted: OpenMetrics, a format the client accepts.
    accepted = running.get("/metrics", Accept="text/plain;q=0, */*")
    assert accepted.status == 200 and accepted.body.endswith(b"# EOF\n")
    assert accepted.getheader("Content-Type").startswith("application/openmetrics-text")


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [("gzip", True), ("deflate, gzip;q=0.5", True), ("gzip;q=0", False), ("notgzip", False), ("", False)],
)
def test_gzip_only_when_acceptable(serve: Any, accept_encoding: str, gzipped: bool) -> None:
    response = serve().get("/metrics", Accept_Encoding=accept_encoding)
    assert (response.getheader("Content-Encoding") == "gzip") is gzipped
    text = (gzip.decompress(response.body) if gzipped else response.body).decode()
    assert sample_value(text, "gpu_up", gpu="0") == 1


def test_a_get_body_is_consumed_not_parsed_as_a_request(serve: Any) -> None:
    running = serve()
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        sock.sendall(
            b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nContent-Length: 23\r\n\r\nGET /nothing HTTP/1.1\r\n"
            b"GET /-/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"Ready\n"):
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b"HTTP/1.1 200") == 2 and b"404" not in received, received


@pytest.fixture(scope="module")
def alice() -> BasicAuth:
    return BasicAuth({"alice": bcrypt_hash("right").encode()})


def test_basic_auth_takes_the_scheme_in_any_case(serve: Any, alice: BasicAuth) -> None:
    running = serve(WebConfig(auth=alice))
    for scheme in ("Basic", "basic", "BASIC"):
        assert running.get("/metrics", Authorization=basic("alice", "right", scheme)).status == 200
    assert running.get("/metrics", Authorization=basic("alice", "wrong")).status == 401
    anonymous = running.get("/-/healthy")
    assert anonymous.status == 401 and anonymous.getheader("WWW-Authenticate").startswith("Basic")


def test_a_password_beyond_bcrypts_72_bytes_is_refused_quietly(
    serve: Any, alice: BasicAuth, caplog: pytest.LogCaptureFixture
) -> None:
    running = serve(WebConfig(auth=alice))
    with caplog.at_level(logging.DEBUG):
        for length in (73, 200, 5000):
            response = running.get("/metrics", Authorization=basic("alice", "r" * length))
            assert response.status == 401
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_a_reload_swaps_users_and_headers_for_the_next_request(serve: Any, alice: BasicAuth) -> None:
    running = serve(WebConfig(auth=alice))
    bob = BasicAuth({"bob": bcrypt_hash("other").encode()})
    running.apply(WebConfig(auth=bob, headers=(("X-Content-Type-Options", "nosniff"),)))
    assert running.get("/metrics", Authorization=basic("alice", "right")).status == 401
    response = running.get("/metrics", Authorization=basic("bob", "other"))
    assert response.status == 200
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    running.apply(WebConfig())
    assert running.get("/metrics").status == 200


def test_a_reload_with_the_same_users_needs_no_new_password_check(serve: Any) -> None:
    users = {"alice": bcrypt_hash("right").encode()}
    running = serve(WebConfig(auth=BasicAuth(users)))
    assert running.get("/metrics", Authorization=basic("alice", "right")).status == 200
    reloaded = BasicAuth(users)
    running.apply(WebConfig(auth=reloaded))
    assert reloaded.remembered(("alice", b"right"))  # the next scrape skips bcrypt


def test_a_taken_port_raises_an_os_error_naming_the_address() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}: ") as caught:
            ExporterServer("127.0.0.1", port, exposition=None, ready=threading.Event())  # type: ignore[arg-type]
    assert isinstance(caught.value, ListenError)
    assert caught.value.errno == errno.EADDRINUSE
    assert caught.value.strerror == f"cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_free_port_is_listened_on_from_construction() -> None:
    server = ExporterServer("127.0.0.1", 0, exposition=None, ready=threading.Event())  # type: ignore[arg-type]
    try:
        assert server.port > 0
        with pytest.raises(OSError):
            socket.create_server(("127.0.0.1", server.port))
    finally:
        asyncio.run(server.stop())
