"""The metrics endpoint: a real HTTP server, apps mounted on real WSGI/ASGI servers, port errors."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from inferwatch.instrumentation.exposition import (
    PortInUseError,
    make_asgi_app,
    make_wsgi_app,
    multiprocess_registry,
    start_http_server,
)
from prometheus_client import CollectorRegistry, Counter

from tests.support import http_get, sample_value


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("llm_test_events", "Events counted by the test.", registry=registry).inc(3)
    return registry


def test_http_server_serves_registry_and_closes(registry: CollectorRegistry, port: int) -> None:
    server = start_http_server(port, registry=registry)
    try:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        status, body = http_get(server.url)
        assert status == 200
        assert sample_value(body, "llm_test_events_total") == 3
    finally:
        server.close()
    with pytest.raises(OSError):
        http_get(server.url, timeout=1)
    server.close()  # a second close is harmless


def test_port_zero_picks_a_free_port(registry: CollectorRegistry) -> None:
    with start_http_server(0, registry=registry) as server:
        assert server.port > 0
        assert sample_value(http_get(server.url)[1], "llm_test_events_total") == 3


def test_port_taken_raises_port_in_use(registry: CollectorRegistry, port: int) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(PortInUseError, match=rf"127\.0\.0\.1:{port}\b.*already in use") as info:
            start_http_server(port, registry=registry)
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize("bad", [-1, 65536, "8000", 1.5, True])
def test_bad_port_raises_value_error(registry: CollectorRegistry, bad: object) -> None:
    with pytest.raises(ValueError, match=r"port must be an integer in 0\.\.65535"):
        start_http_server(bad, registry=registry)  # type: ignore[arg-type]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def wsgi_server(registry: CollectorRegistry) -> Iterator[str]:
    """A user's WSGI app on a real server, with the metrics app mounted at /metrics."""
    metrics_app = make_wsgi_app(registry)

    def user_app(environ, start_response):
        if environ["PATH_INFO"] == "/metrics":
            return metrics_app(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"generated text"]

    httpd = make_server("127.0.0.1", 0, user_app, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


def test_wsgi_app_mounted_on_a_server(wsgi_server: str) -> None:
    assert http_get(wsgi_server + "/generate") == (200, "generated text")
    status, body = http_get(wsgi_server + "/metrics")
    assert status == 200
    assert sample_value(body, "llm_test_events_total") == 3


def test_asgi_app_answers_an_http_request(registry: CollectorRegistry) -> None:
    app = make_asgi_app(registry)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/metrics",
        "raw_path": b"/metrics",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), (b"accept", b"text/plain")],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start, body = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"Content-Type"].startswith(b"text/plain")
    assert body["type"] == "http.response.body"
    assert sample_value(body["body"].decode(), "llm_test_events_total") == 3


def test_multiprocess_registry_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiprocess mode needs an existing directory"):
        multiprocess_registry(tmp_path / "missing")
