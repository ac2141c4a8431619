"""The metrics endpoint: a real HTTP server, apps mounted on real WSGI/ASGI servers, port errors."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psutil
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from inferwatch.instrumentation.endpoint.app import (
    AGE_HEADER,
    CPU_BURST,
    CPU_SHARE,
    HELPER_CPU_SHARE,
    MAX_AGE,
    REFRESH_SHARE,
    RENDER_BURST,
    RENDER_SHARE,
    EndpointApp,
    Renderer,
)
from inferwatch.instrumentation.endpoint.server import (
    HTTP_PROCESS_ENV,
    THREAD_NAME,
    PortInUseError,
    helper_process_wanted,
    make_asgi_app,
    make_wsgi_app,
    multiprocess_registry,
    start_http_server,
)
from tests.support import http_get, sample_value
from tests.support.clock import ManualClock
from tests.support.httpload import Load, Target
from tests.support.services import wait_until

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4"


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
    headers, text = _get(make_asgi_app(registry), "text/plain")
    assert headers["content-type"].startswith("text/plain")
    assert sample_value(text, "llm_test_events_total") == 3


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


# Every format refused (q=0), by the range or each one named: 406, not the text format.
REFUSING = ("*/*;q=0", "application/openmetrics-text;q=0, text/plain;q=0, */*;q=0")
# The text format refused, the rest accepted through */*: OpenMetrics, the format the client accepts.
TEXT_REFUSED = "text/plain;q=0, */*"


@pytest.mark.parametrize("helper", [True, False], ids=["helper-process", "thread"])
def test_the_endpoint_answers_406_when_every_format_is_refused(
    registry: CollectorRegistry, helper: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HTTP_PROCESS_ENV, "1" if helper else "0")
    with start_http_server(0, registry=registry) as server:
        for accept in REFUSING:
            refused, body = _request(server.port, Accept=accept)
            assert refused.status == 406, accept
            assert b"text/plain, application/openmetrics-text" in body
            head, nothing = _request(server.port, "HEAD", Accept=accept)
            assert head.status == 406 and nothing == b""
        accepted, body = _request(server.port, Accept=TEXT_REFUSED)
    assert accepted.status == 200
    assert accepted.getheader("Content-Type").startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_the_mounted_apps_answer_406_when_every_format_is_refused(
    registry: CollectorRegistry, wsgi_server: str
) -> None:
    port = int(wsgi_server.rsplit(":", 1)[1])
    asgi = make_asgi_app(registry)
    for accept in REFUSING:
        refused, body = _request(port, Accept=accept)
        assert refused.status == 406 and refused.reason == "Not Acceptable", accept
        assert b"text/plain, application/openmetrics-text" in body
        _, text = _get(asgi, accept, status=406)
        assert "text/plain, application/openmetrics-text" in text
    accepted, body = _request(port, Accept=TEXT_REFUSED)
    assert accepted.status == 200
    assert accepted.getheader("Content-Type").startswith("application/openmetrics-text")
    headers, text = _get(asgi, TEXT_REFUSED)
    assert headers["content-type"].startswith("application/openmetrics-text") and text.endswith("# EOF\n")


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


def _helper() -> psutil.Process:
    """This process's endpoint helper process (:mod:`inferwatch.instrumentation.endpoint.helper_process`)."""
    (helper,) = [p for p in psutil.Process().children() if p.name() == THREAD_NAME]
    return helper


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@pytest.mark.timing  # a CPU share over 3 s of wall time: in the timing tier, not the unit tier's
@pytest.mark.parametrize("helper", [True, False], ids=["helper-process", "thread"])
def test_a_flood_of_scrapes_takes_a_bounded_share_of_a_core(
    registry: CollectorRegistry, helper: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HTTP_PROCESS_ENV, "1" if helper else "0")
    # A registry the size of an instrumented model's: rendering is the expensive part of a scrape.
    for i in range(60):
        Histogram(f"llm_test_histogram_{i}", "A histogram.", registry=registry).observe(0.1)
    with start_http_server(0, registry=registry) as server:
        (thread,) = [t for t in threading.enumerate() if t.name == THREAD_NAME]
        clock = time.pthread_getcpuclockid(thread.ident)
        process = _helper() if helper else None
        with Load(Target("127.0.0.1", server.port), scrapers=50) as load:
            load.wait_for(20)
            cpu, wall = time.clock_gettime(clock), time.monotonic()
            helper_cpu = _cpu_seconds(process) if process is not None else 0.0
            time.sleep(3)
            elapsed = time.monotonic() - wall
            share = (time.clock_gettime(clock) - cpu) / elapsed
            helper_share = (_cpu_seconds(process) - helper_cpu) / elapsed if process is not None else 0.0
    if helper:
        # The serving process only collects: once per MAX_AGE, or within the renderings' budget.
        assert share < RENDER_SHARE + RENDER_BURST / 3 + 0.01, share
        # The helper keeps to its own budget, which counts everything its loop does.
        assert helper_share < HELPER_CPU_SHARE + CPU_BURST / 3 + 0.05, helper_share
    else:
        # The budget's share plus its burst spread over the window, and some slack for the measurement.
        assert share < CPU_SHARE + CPU_BURST / 3 + 0.01, share
    assert load.latencies.errors == [], load.latencies.errors[:5]
    assert len(load.latencies.seconds) > 50  # slowed down, still answered


def test_the_helper_process_serves_restarts_and_goes_with_the_endpoint(registry: CollectorRegistry) -> None:
    counter = Counter("llm_restart_events", "Events counted around a restart.", registry=registry)
    with start_http_server(0, registry=registry) as server:
        helper = _helper()
        assert helper.cmdline()[1] == "-I"  # isolated from PYTHONPATH and its sitecustomize
        helper.kill()
        helper.wait(10)
        counter.inc()

        def served() -> float | None:
            try:
                return sample_value(http_get(server.url, timeout=2)[1], "llm_restart_events_total")
            except OSError:
                return None

        assert wait_until(served, timeout=30, what="the helper to be started again") == 1
        again = _helper()
        assert again.pid != helper.pid
    # Closing the endpoint ends the helper and frees the port.
    again.wait(10)
    with pytest.raises(OSError):
        http_get(server.url, timeout=1)


def test_the_endpoint_serves_from_a_thread_where_no_helper_can_start(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/local/bin/uwsgi")  # an embedding program: not tried
    assert not helper_process_wanted({})
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3-missing")
    with start_http_server(0, registry=registry) as server:  # the helper cannot be started: a thread serves
        assert [p for p in psutil.Process().children() if p.name() == THREAD_NAME] == []
        assert sample_value(http_get(server.url)[1], "llm_test_events_total") == 3


@pytest.mark.parametrize("value", ["yes", "2", ""])
def test_a_bad_http_process_setting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=f"{HTTP_PROCESS_ENV} must be 1 or 0"):
        helper_process_wanted({HTTP_PROCESS_ENV: value})


class _Slow:
    """A collector that takes ``cpu`` seconds of CPU to collect and counts its collections in a gauge."""

    def __init__(self, cpu: float) -> None:
        self.cpu = cpu
        self.collections = 0

    def collect(self) -> list[Metric]:
        started = time.thread_time()
        while time.thread_time() - started < self.cpu:
            pass
        self.collections += 1
        return [GaugeMetricFamily("llm_test_collections", "Collections so far.", value=self.collections)]


def _get(
    app: Any, accept: str, query: bytes = b"", clock: ManualClock | None = None, status: int = 200
) -> tuple[dict[str, str], str]:
    """One GET through ``app`` as ASGI, with the scope an ASGI server passes, answered with ``status``;
    the answer's headers (lower-case names) and text. With the app's ``clock``, that clock is moved while
    the request waits for its CPU budget, a hundredth of a second at a time."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/metrics",
        "raw_path": b"/metrics",
        "query_string": query,
        "headers": [(b"host", b"localhost"), (b"accept", accept.encode())],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def answered() -> None:
        request = asyncio.ensure_future(app(scope, receive, send))
        if clock is not None:
            await clock.advance_until_done(request, step=0.01)
        await request

    asyncio.run(answered())
    start, body = sent
    assert start["type"] == "http.response.start" and start["status"] == status
    assert body["type"] == "http.response.body"
    headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    return headers, body["body"].decode()


def _collections(text: str) -> float | None:
    return sample_value(text.replace("# EOF\n", ""), "llm_test_collections")


def test_every_variant_is_answered_from_one_collection_at_most_max_age_old() -> None:
    slow = _Slow(cpu=0.01)
    clock = ManualClock()  # the wall clock; the CPU is spent for real
    app = EndpointApp(Renderer(slow, clock=clock), clock=clock)
    # Collected for each request until the renderings' budget is spent (its 50 ms burst: ~5 of these).
    for _ in range(10):
        headers, _ = _get(app, "text/plain", clock=clock)
    collected = slow.collections
    assert 3 <= collected <= 8, collected
    # Past the budget, both formats get the last collection, encoded once each, and say how old it is.
    for accept in ["text/plain", OPENMETRICS_ACCEPT] * 5:
        headers, text = _get(app, accept, clock=clock)
        assert _collections(text) == collected
        assert headers["age"] == "0"
        assert 0 <= float(headers[AGE_HEADER.lower()]) < MAX_AGE
    assert slow.collections == collected
    # Once it is MAX_AGE old, the next request gets a new collection whatever the budget says.
    clock.advance(MAX_AGE + 0.05)
    headers, text = _get(app, OPENMETRICS_ACCEPT, clock=clock)
    assert _collections(text) == collected + 1 == slow.collections
    assert "age" not in headers and float(headers[AGE_HEADER.lower()]) < 0.1


class _Clock(ManualClock):
    """The endpoint's wall clock, and a CPU clock, that the test moves."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu = 0.0

    def thread_time(self) -> float:
        return self.cpu


class _Costly:
    """A collector whose collections take ``cost`` CPU seconds of ``clock`` each, counted in a gauge."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.cost = 0.001
        self.collections = 0

    def collect(self) -> list[Metric]:
        self.clock.cpu += self.cost
        self.collections += 1
        return [GaugeMetricFamily("llm_test_collections", "Collections so far.", value=self.collections)]


class _Budget:
    def __init__(self, available: bool) -> None:
        self.is_available = available

    def available(self) -> bool:
        return self.is_available


@pytest.fixture
def clocked() -> tuple[_Clock, _Costly, _Budget, Any]:
    """An endpoint app on clocks the test moves; its renderings' budget says what the test sets."""
    clock = _Clock()
    collector = _Costly(clock)
    renderer = Renderer(collector, clock=clock, cpu=clock.thread_time)
    app = EndpointApp(renderer, clock=clock, cpu=clock.thread_time)
    rendering = _Budget(True)
    renderer._rendering = rendering  # type: ignore[assignment]

    def scrape(accept: str = "text/plain") -> tuple[float | None, str | None, str]:
        headers, text = _get(app, accept, clock=clock)
        return _collections(text), headers.get("age"), headers[AGE_HEADER.lower()]

    return clock, collector, rendering, scrape


def test_what_the_endpoint_collects_again_and_what_it_says(clocked: Any) -> None:
    clock, collector, rendering, scrape = clocked
    # Within the renderings' budget, every request gets a collection of its own.
    assert scrape() == (1, None, "0.000")
    assert scrape(OPENMETRICS_ACCEPT) == (2, None, "0.000")
    # Beyond it, the last collection, for every variant, saying how old it is.
    rendering.is_available = False
    clock.advance(0.5)
    assert scrape() == (2, "0", "0.500")
    assert scrape(OPENMETRICS_ACCEPT) == (2, "0", "0.500")
    # MAX_AGE old: collected again, whatever the renderings' budget says.
    clock.advance(MAX_AGE - 0.5)
    assert scrape(OPENMETRICS_ACCEPT) == (3, None, "0.000")
    # Collections that typically take 30 ms, more than MAX_AGE * REFRESH_SHARE, are collected again once
    # paid back at REFRESH_SHARE: 1.5 s. The answers say how old they are, in whole seconds too (Age).
    collector.cost = 0.03
    for collections in (4, 5, 6):  # the median of the three before the last turns costly at the 6th
        clock.advance(MAX_AGE)
        assert scrape()[0] == collections
    clock.advance(1.25)
    assert scrape() == (6, "1", "1.250")
    clock.advance(0.03 / REFRESH_SHARE - 1.25)
    assert scrape() == (7, None, "0.000")


def test_one_slow_collection_does_not_hold_the_next_back(clocked: Any) -> None:
    clock, collector, rendering, scrape = clocked
    rendering.is_available = False
    for collections in range(1, 5):
        assert scrape()[0] == collections
        clock.advance(MAX_AGE)
    collector.cost = 0.3  # a garbage collection, or the kernel reclaiming memory, in its middle
    assert scrape()[0] == 5
    collector.cost = 0.001
    for collections in (6, 7):  # not kept 15 s, until 0.3 s are paid back at REFRESH_SHARE
        clock.advance(MAX_AGE)
        assert scrape() == (collections, None, "0.000")


def test_a_costly_first_collection_does_not_hold_the_next_ones_back(clocked: Any) -> None:
    """A registry's first collection does one-off work (the catalogue's collector formats every series'
    name once): its cost is not a typical one."""
    clock, collector, rendering, scrape = clocked
    rendering.is_available = False
    collector.cost = 0.3
    assert scrape()[0] == 1
    collector.cost = 0.002
    for collections in (2, 3, 4, 5):
        clock.advance(MAX_AGE)
        assert scrape() == (collections, None, "0.000")
    # Three costly collections in a row are typical: then they are paid back at REFRESH_SHARE.
    collector.cost = 0.3
    for collections in (6, 7, 8):
        clock.advance(MAX_AGE)
        assert scrape()[0] == collections
    clock.advance(MAX_AGE)
    assert scrape()[0] == 8


def test_a_helpers_idle_work_does_not_hold_back_the_first_scrape_after_a_quiet_spell() -> None:
    """The helper process's budget counts all of its thread's CPU, its idle work too (pings, parent
    checks, heap trims: ~4 ms a second under ``transformers serve``); the first scrape after 130 s of it
    waited 3-4 s, after a few minutes past a scraper's 10 s timeout."""
    clock = _Clock()
    renderer = Renderer(_Costly(clock), clock=clock, cpu=clock.thread_time)
    app = EndpointApp(renderer, clock=clock, cpu=clock.thread_time, share=HELPER_CPU_SHARE, whole_thread=True)
    _get(app, "text/plain", clock=clock)
    for _ in range(130):
        clock.advance(1.0)
        clock.cpu += 0.004
    before = clock.now
    headers, _ = _get(app, "text/plain", clock=clock)
    assert clock.now == before  # answered without waiting for the budget
    assert float(headers[AGE_HEADER.lower()]) == 0.0


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
