"""Scraping real HTTP endpoints: samples when they answer, a one-line reason when they do not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from inferwatch.monitor.scrape import instance_of, normalize_url, parse_exposition, scrape, scrape_round
from tests.support import free_port


@contextmanager
def http_server(status: int, body: bytes, held: bool = False) -> Iterator[str]:
    """A real HTTP server on loopback answering every GET with ``status`` and ``body``; ``held``: not
    before the test is over (an endpoint that never answers in time, however slowly the test runs)."""
    released = threading.Event()
    if not held:
        released.set()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            released.wait()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting: what the time-out test wants

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_parse_exposition_adds_labels() -> None:
    text = '# TYPE x_total counter\nx_total{a="1"} 3\n# TYPE g gauge\ng 2.5\n'
    samples = parse_exposition(text, {"instance": "h:1"})
    assert [(s.name, dict(s.labels), s.value) for s in samples] == [
        ("x_total", {"a": "1", "instance": "h:1"}, 3.0),
        ("g", {"instance": "h:1"}, 2.5),
    ]


@pytest.mark.parametrize(
    ("given", "url", "instance"),
    [
        ("127.0.0.1:8798", "http://127.0.0.1:8798/metrics", "127.0.0.1:8798"),
        ("http://gpu-node:8797", "http://gpu-node:8797/metrics", "gpu-node:8797"),
        ("http://gpu-node:8797/", "http://gpu-node:8797/metrics", "gpu-node:8797"),
        ("https://gpu-node/custom/path", "https://gpu-node/custom/path", "gpu-node:443"),
    ],
)
def test_urls(given: str, url: str, instance: str) -> None:
    assert normalize_url(given) == url
    assert instance_of(url) == instance


def test_scrape_a_prometheus_client_server() -> None:
    registry = CollectorRegistry()
    Counter("llm_generation_tokens", "", ["model"], registry=registry).labels("m").inc(42)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        result = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        thread.join(timeout=5)
    assert result.up and result.error is None
    assert result.instance == f"127.0.0.1:{port}"
    tokens = [s for s in result.samples if s.name == "llm_generation_tokens_total"]
    assert [(s.label("model"), s.label("instance"), s.value) for s in tokens] == [
        ("m", result.instance, 42.0)
    ]


def test_a_closed_port_is_down_with_the_reason() -> None:
    result = scrape(f"http://127.0.0.1:{free_port()}/metrics", timeout=2)
    assert not result.up
    assert result.error == "connection failed: Connection refused"
    assert result.samples == ()


def test_an_http_error_is_down() -> None:
    with http_server(503, b"overloaded") as url:
        result = scrape(url)
    assert (result.up, result.error) == (False, "HTTP 503 Service Unavailable")


@pytest.mark.timing
def test_a_slow_endpoint_is_down_after_the_timeout() -> None:
    with http_server(200, b"# TYPE up gauge\nup 1\n", held=True) as url:
        result = scrape(url, timeout=0.3)
    assert (result.up, result.error) == (False, "no answer within 0.3s")
    assert result.duration_s < 1.5


def test_text_that_is_not_an_exposition_is_down() -> None:
    with http_server(200, b"<html>hello</html>") as url:
        result = scrape(url)
    assert not result.up
    assert result.error.startswith("not a Prometheus exposition")


def test_a_round_keeps_every_endpoint_in_order() -> None:
    with http_server(200, b"# TYPE up gauge\nup 1\n") as good:
        bad = f"http://127.0.0.1:{free_port()}/metrics"
        snap = scrape_round([bad, good], timeout=2)
    assert [e.up for e in snap.endpoints] == [False, True]
    assert [s.label("instance") for s in snap.samples("up")] == [snap.endpoints[1].instance]
