"""The metrics endpoint: a real HTTP server, apps mounted on real WSGI/ASGI servers, port errors."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from inferwatch.instrumentation.exposition import (
    CPU_BURST,
    CPU_SHARE,
    PortInUseError,
    make_asgi_app,
    make_wsgi_app,
    multiprocess_registry,
    start_http_server,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric

from tests.support import http_get, sample_value
from tests.support.httpload import Load, Target


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


def _request(port: int, method: str = "GET", path: str = "/metrics", **headers: str) -> tuple[Any, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response, body


def test_head_and_other_methods_on_the_endpoint(registry: CollectorRegistry) -> None:
    with start_http_server(0, registry=registry) as server:
        got, body = _request(server.port)
        head, nothing = _request(server.port, "HEAD", "/anything")
        assert head.status == got.status == 200 and nothing == b""
        assert head.getheader("Content-Length") == str(len(body))
        posted, _ = _request(server.port, "POST")
        assert posted.status == 405 and posted.getheader("Allow") == "GET, HEAD"
        assert got.version == 11 and got.getheader("Server") is None


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        (
            "text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.9",
            "application/openmetrics-text",
        ),
        ("application/openmetrics-text;q=0,text/plain;version=0.0.4", "text/plain; version=0.0.4"),
        # prometheus_client's own formats stay: the text format 1.0.0 with its escaping, chosen by weight.
        (
            "text/plain;version=1.0.0;escaping=underscores;q=0.9,text/plain;version=0.0.4;q=0.1",
            "text/plain; version=1.0.0",
        ),
    ],
)
def test_the_endpoint_and_the_apps_choose_the_format_by_weight(
    registry: CollectorRegistry, wsgi_server: str, accept: str, content_type: str
) -> None:
    with start_http_server(0, registry=registry) as server:
        response, _ = _request(server.port, Accept=accept)
        assert response.getheader("Content-Type").startswith(content_type)
    port = int(wsgi_server.rsplit(":", 1)[1])
    mounted, _ = _request(port, Accept=accept)
    assert mounted.getheader("Content-Type").startswith(content_type)


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"), [("gzip", True), ("gzip;q=0", False), ("br, xgzip", False)]
)
def test_gzip_only_when_acceptable(registry: CollectorRegistry, accept_encoding: str, gzipped: bool) -> None:
    with start_http_server(0, registry=registry) as server:
        response, body = _request(server.port, Accept_Encoding=accept_encoding)
    assert (response.getheader("Content-Encoding") == "gzip") is gzipped
    text = (gzip.decompress(body) if gzipped else body).decode()
    assert sample_value(text, "llm_test_events_total") == 3


def test_scrapes_within_the_budget_are_always_fresh(registry: CollectorRegistry) -> None:
    counter = Counter("llm_fresh_events", "Events counted between two scrapes.", registry=registry)
    with start_http_server(0, registry=registry) as server:
        for expected in range(1, 6):
            counter.inc()
            _, body = _request(server.port)
            assert sample_value(body.decode(), "llm_fresh_events_total") == expected


def test_a_flood_of_scrapes_takes_a_bounded_share_of_a_core(registry: CollectorRegistry) -> None:
    # A registry the size of an instrumented model's: rendering is the expensive part of a scrape.
    for i in range(60):
        Histogram(f"llm_test_histogram_{i}", "A histogram.", registry=registry).observe(0.1)
    with start_http_server(0, registry=registry) as server:
        (thread,) = [t for t in threading.enumerate() if t.name == "inferwatch-http"]
        clock = time.pthread_getcpuclockid(thread.ident)
        with Load(Target("127.0.0.1", server.port), scrapers=50) as load:
            load.wait_for(20)
            cpu, wall = time.clock_gettime(clock), time.monotonic()
            time.sleep(3)
            share = (time.clock_gettime(clock) - cpu) / (time.monotonic() - wall)
    # The budget's share plus its burst spread over the window, and some slack for the measurement.
    assert share < CPU_SHARE + CPU_BURST / 3 + 0.01, share
    assert load.latencies.errors == [], load.latencies.errors[:5]
    assert len(load.latencies.seconds) > 50  # slowed down, still answered


class _Families:
    """A collector that is not a registry: ``name[]`` restricts it too."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> list[Metric]:
        return list(self._registry.collect())


@pytest.mark.parametrize(("app", "collector"), [("endpoint", False), ("wsgi", False), ("endpoint", True)])
def test_name_restricts_the_answer_to_those_samples(app: str, collector: bool) -> None:
    registry = CollectorRegistry()
    Counter("llm_test_events", "Events.", registry=registry).inc(3)
    Gauge("llm_test_wait_seconds", "A wait.", unit="seconds", registry=registry).set(2)
    Gauge("llm_test_other", "Not asked for.", registry=registry).set(1)
    served = _Families(registry) if collector else registry
    query = "name[]=llm_test_wait_seconds&name[]=llm_test_events_total"
    accept = "application/openmetrics-text;version=1.0.0"
    if app == "endpoint":
        with start_http_server(0, registry=served) as server:
            _, body = _request(server.port, path=f"/metrics?{query}", Accept=accept)
    else:
        environ = {"REQUEST_METHOD": "GET", "QUERY_STRING": query, "HTTP_ACCEPT": accept}
        body = b"".join(make_wsgi_app(served)(environ, lambda status, headers: None))
    text = body.decode()
    # The samples asked for, with their families' metadata (the unit too); llm_test_events_created and
    # llm_test_other are not.
    assert "# UNIT llm_test_wait_seconds seconds" in text
    assert "llm_test_wait_seconds 2.0" in text and "llm_test_events_total 3.0" in text
    assert "llm_test_events_created" not in text and "llm_test_other" not in text
