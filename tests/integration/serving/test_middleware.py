"""``ArrivalMiddleware`` and ``WSGIArrivalMiddleware`` under real HTTP servers: latencies as clients see them.

A serving handler rarely calls ``generate`` the moment a request arrives: it waits for the model (a lock,
as single-GPU servers serialize ``generate``), then runs ``generate`` in a ``threading.Thread`` of its own
and streams the tokens back from a streamer. The middleware opens an arrival per HTTP request and carries it
into that thread, so TTFT and end-to-end latency are taken from the arrival and the wait is the queue time.
What is checked is what a user would compare: the server's means against what real clients measure over
real sockets, which is why these are integration tests: a real uvicorn (ASGI, Starlette) and a real
``wsgiref`` threading server (WSGI) on loopback, a real tiny model, concurrent ``requests`` clients. A
control without the middleware shows what it changes: TTFT then starts at ``generate``'s entry.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from statistics import mean
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests
import torch
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from transformers.generation.streamers import BaseStreamer
from werkzeug.serving import make_server as make_werkzeug_server

from inferwatch.instrumentation import InstrumentationHandle, instrument
from inferwatch.instrumentation.demo.models import build_model, encode_text
from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware, WSGIArrivalMiddleware
from tests.support.asgi_server import serve_asgi
from tests.support.clienttiming import without_gc_pauses
from tests.support.generation import generate_greedy

pytestmark = pytest.mark.integration

MODEL_NAME = "tiny-llama"
CLIENTS = 4
#: Tokens per request: long enough that the requests overlap and queue on the lock, short on a 2-core box.
MAX_NEW_TOKENS = 32
# The server's mean within 10 % of the clients' mean, or within 50 ms of it: what lies between the two
# (the request crossing loopback before the arrival opens; after the token is sampled: the streamer queue,
# the hop to the thread that writes the chunk and the socket) is a few ms a request.
RELATIVE_TOLERANCE = 0.10
ABSOLUTE_TOLERANCE = 0.05
#: How long the control test holds the lock once its request is waiting on it.
HELD_SECONDS = 0.3
#: How long the stall handler blocks the event loop.
STALL_SECONDS = 0.3
TIMEOUT = 60.0


# ------------------------------------------------------------------------------------------------ the model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    model = build_model(MODEL_NAME)
    # First-call costs (lazy imports, allocator) outside the timings.
    generate_greedy(model, torch.tensor([encode_text("warm-up")]), new_tokens=MAX_NEW_TOKENS)
    return model


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def handle(model: torch.nn.Module, registry: CollectorRegistry) -> Iterator[InstrumentationHandle]:
    handle = instrument(model, model_name=MODEL_NAME, registry=registry)
    yield handle
    handle.remove()


class QueueStreamer(BaseStreamer):
    """``TextIteratorStreamer`` without a tokenizer: generated token ids, in order, through a queue.

    ``generate`` puts the prompt first, then each step's sampled tokens, and calls ``end`` when done."""

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self._queue.put(token)

    def end(self) -> None:
        self._queue.put(self._END)

    def fail(self, exc: BaseException) -> None:
        self._queue.put(exc)

    def __iter__(self) -> Iterator[int]:
        while True:
            item = self._queue.get(timeout=TIMEOUT)
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass
class Backend:
    """What the handlers of both apps share: the model, the lock that serializes generate, and a count of
    the requests that started waiting on it (the control test waits for its request to be queued)."""

    model: torch.nn.Module
    lock: threading.Lock = field(default_factory=threading.Lock)
    queued: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    stalling: threading.Event = field(default_factory=threading.Event)

    def tokens(self, prompt: str) -> Iterator[bytes]:
        """The response body: wait for the model, run generate in a thread, stream each token as it comes."""
        self.queued.release()
        with self.lock:
            streamer = QueueStreamer()

            def work() -> None:
                try:
                    # exact_length keeps EOS out: every request streams exactly MAX_NEW_TOKENS tokens.
                    ids = torch.tensor([encode_text(prompt)])
                    generate_greedy(self.model, ids, new_tokens=MAX_NEW_TOKENS, streamer=streamer)
                except BaseException as exc:
                    streamer.fail(exc)
                    raise

            worker = threading.Thread(target=work, name="generate", daemon=True)
            worker.start()
            try:
                for token in streamer:
                    yield f"{token} ".encode()
            finally:
                worker.join(timeout=TIMEOUT)


# ------------------------------------------------------------------------------------------------ the apps


def asgi_app(backend: Backend, *, middleware: bool, registry: CollectorRegistry | None = None) -> Any:
    async def generate(request: Request) -> StreamingResponse:
        prompt = (await request.json())["prompt"]
        # A sync iterator: Starlette runs each step in a worker thread (the lock wait blocks no event loop),
        # in a copy of the request's context, so the arrival reaches the thread started there.
        return StreamingResponse(backend.tokens(prompt), media_type="text/plain")

    async def stall(request: Request) -> PlainTextResponse:
        """Blocks the event loop, as a thread that holds the GIL or a blocking handler would."""
        backend.stalling.set()
        time.sleep(STALL_SECONDS)
        return PlainTextResponse("stalled")

    app = Starlette(
        routes=[Route("/generate", generate, methods=["POST"]), Route("/stall", stall, methods=["POST"])]
    )
    return ArrivalMiddleware(app, registry=registry) if middleware else app


def wsgi_app(
    backend: Backend, *, middleware: bool, registry: CollectorRegistry | None = None
) -> Callable[..., Any]:
    def app(environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        start_response("200 OK", [("Content-Type", "text/plain")])
        if environ.get("PATH_INFO") == "/stall":  # holds a server that serves one request at a time
            backend.stalling.set()
            time.sleep(STALL_SECONDS)
            return [b"stalled"]
        return backend.tokens(json.loads(body)["prompt"])

    return WSGIArrivalMiddleware(app, registry=registry) if middleware else app


# --------------------------------------------------------------------------------------------- the servers


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on the test's stderr."""


@contextmanager
def serving_in_a_thread(server: Any, name: str) -> Iterator[str]:
    """A socketserver-based WSGI server (wsgiref's, werkzeug's) serving in a thread: its base URL; shut
    down and joined."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=15)
        assert not thread.is_alive(), f"{name} did not shut down"


def serve_werkzeug_one_at_a_time(app: Callable[..., Any]) -> AbstractContextManager[str]:
    """werkzeug's WSGI server without threads: one request at a time, as a sync worker serves."""
    return serving_in_a_thread(make_werkzeug_server("127.0.0.1", 0, app, threaded=False), "werkzeug")


@contextmanager
def serve_wsgi(app: Callable[..., Any]) -> Iterator[str]:
    """``wsgiref`` with a thread per request: the app's URL."""
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    with serving_in_a_thread(server, "wsgiref") as base:
        yield f"{base}/generate"


# --------------------------------------------------------------------------------------------- the clients


@dataclass(frozen=True)
class Timing:
    """One request as its client saw it: seconds from sending it to the first body chunk and to the end."""

    status: int
    tokens: int
    first_chunk: float
    total: float


def fetch(url: str, prompt: str) -> Timing:
    with without_gc_pauses():  # what this process's collector stops is not the server's time
        start = time.perf_counter()
        first_chunk = None
        body = b""
        with requests.post(url, json={"prompt": prompt}, stream=True, timeout=TIMEOUT) as response:
            # One byte at a time: a read returns as soon as anything came (wsgiref's HTTP/1.0 body has no
            # length and no chunks; a larger read would wait for more bytes).
            for chunk in response.iter_content(chunk_size=1):
                if chunk and first_chunk is None:
                    first_chunk = time.perf_counter() - start
                body += chunk
            status = response.status_code
        total = time.perf_counter() - start
    assert first_chunk is not None, f"{url}: HTTP {status}, empty body"
    return Timing(status, len(body.split()), first_chunk, total)


def concurrent_fetches(url: str, clients: int) -> list[Timing]:
    """``clients`` requests sent at once, from a thread each."""
    barrier = threading.Barrier(clients)

    def one(index: int) -> Timing:
        barrier.wait(timeout=TIMEOUT)
        return fetch(url, f"request {index}: tell me a story")

    with ThreadPoolExecutor(max_workers=clients) as pool:
        return list(pool.map(one, range(clients)))


# ------------------------------------------------------------------------------------------------ checking


#: End-to-end latency, read for the served requests (its other outcome is a cancelled one's).
E2E, SERVED = "llm_e2e_request_latency_seconds", {"outcome": "ok"}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, {"model": MODEL_NAME, **labels})
    return 0.0 if found is None else found


def server_mean(registry: CollectorRegistry, histogram: str) -> float:
    labels = SERVED if histogram == E2E else {}
    count = value(registry, f"{histogram}_count", **labels)
    assert count > 0, f"{histogram}: no observation"
    return value(registry, f"{histogram}_sum", **labels) / count


def assert_close(what: str, server: float, clients: float) -> None:
    tolerance = max(RELATIVE_TOLERANCE * clients, ABSOLUTE_TOLERANCE)
    assert abs(server - clients) <= tolerance, (
        f"{what}: server mean {server * 1000:.1f} ms, clients' mean {clients * 1000:.1f} ms "
        f"(tolerance {tolerance * 1000:.1f} ms)"
    )


def check_concurrent_requests(
    registry: CollectorRegistry, handle: InstrumentationHandle, timings: list[Timing]
) -> None:
    assert [t.status for t in timings] == [200] * CLIENTS
    assert [t.tokens for t in timings] == [MAX_NEW_TOKENS] * CLIENTS
    assert handle.flush()
    assert value(registry, "llm_requests_total", status="ok") == CLIENTS
    assert value(registry, "llm_time_to_first_token_seconds_count") == CLIENTS
    assert value(registry, "llm_e2e_request_latency_seconds_count", **SERVED) == CLIENTS
    # Every request was timed from its arrival, and those behind the lock waited for it.
    assert value(registry, "llm_request_queue_seconds_count") == CLIENTS
    assert value(registry, "llm_request_queue_seconds_sum") > 0
    assert_close(
        "TTFT",
        server_mean(registry, "llm_time_to_first_token_seconds"),
        mean(t.first_chunk for t in timings),
    )
    # The server's E2E ends when generate returns; the client's once the end of the body reached it (the
    # thread writing the chunks joins the generate thread, releases the lock, ends the body). Measured
    # here, the clients' means exceed the server's by 4-13 ms, the same for TTFT and E2E (under load too):
    # the gap is before the arrival (the client building and sending the request, the server parsing it),
    # the final chunk lags generate's return by under 1 ms.
    assert_close(
        "E2E",
        server_mean(registry, "llm_e2e_request_latency_seconds"),
        mean(t.total for t in timings),
    )


# ---------------------------------------------------------------------------------------------------- tests


@pytest.mark.timeout(120)
def test_asgi_requests_are_timed_from_their_arrival(model, registry, handle) -> None:
    backend = Backend(model)
    with serve_asgi(asgi_app(backend, middleware=True)) as base:
        url = f"{base}/generate"
        timings = concurrent_fetches(url, CLIENTS)
    check_concurrent_requests(registry, handle, timings)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", ["uvicorn", "werkzeug"])
def test_a_request_held_in_the_socket_is_timed_from_the_kernels_receipt(
    server, model, registry, handle
) -> None:
    """A request is sent while the server cannot read it for STALL_SECONDS: uvicorn's event loop blocked
    (as by a thread that holds the GIL), werkzeug serving one request at a time busy with another. It waits
    in its socket meanwhile. Its TTFT and E2E start when the kernel received it (as the client's do), and
    the wait before the middleware saw it is ``llm_request_socket_wait_seconds``."""
    backend = Backend(model)
    if server == "uvicorn":
        serving = serve_asgi(asgi_app(backend, middleware=True, registry=registry))
    else:
        serving = serve_werkzeug_one_at_a_time(wsgi_app(backend, middleware=True, registry=registry))
    with serving as base, ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(requests.post, f"{base}/stall", json={}, timeout=TIMEOUT)
        assert backend.stalling.wait(TIMEOUT), "the stall handler never ran"
        timing = fetch(f"{base}/generate", "a request sent while the server cannot read it")
        assert stalled.result(timeout=TIMEOUT).status_code == 200
    assert timing.status == 200
    assert handle.flush()
    # The model's request was timed from the kernel's receipt (a server whose layout is known, TCP); the
    # stall ran no model and is no model's arrival.
    assert registry.get_sample_value("llm_http_arrivals_total", {"source": "socket"}) == 1
    assert registry.get_sample_value("llm_http_arrivals_total", {"source": "application"}) in (None, 0.0)
    # The request was sent right after the stall began; the receipt's time is one scheduler tick coarse.
    assert value(registry, "llm_request_socket_wait_seconds_count") == 1
    waited = value(registry, "llm_request_socket_wait_seconds_sum")
    assert STALL_SECONDS - 0.1 <= waited <= STALL_SECONDS + 0.02, waited
    # The client's figures hold the stall; timed from the middleware's call the server's would be short of
    # them by the wait.
    assert_close("TTFT", server_mean(registry, "llm_time_to_first_token_seconds"), timing.first_chunk)
    assert_close("E2E", server_mean(registry, "llm_e2e_request_latency_seconds"), timing.total)


@pytest.mark.timeout(120)
def test_wsgi_requests_are_timed_from_their_arrival(model, registry, handle) -> None:
    backend = Backend(model)
    with serve_wsgi(wsgi_app(backend, middleware=True)) as url:
        timings = concurrent_fetches(url, CLIENTS)
    check_concurrent_requests(registry, handle, timings)


@pytest.mark.timeout(120)
def test_without_the_middleware_ttft_starts_at_generate(model, registry, handle) -> None:
    """The control: the request waits HELD_SECONDS on the lock, and the server's TTFT does not see it."""
    backend = Backend(model)
    with serve_asgi(asgi_app(backend, middleware=False)) as base, ThreadPoolExecutor(1) as pool:
        url = f"{base}/generate"
        with backend.lock:
            future = pool.submit(fetch, url, "a request that waits")
            assert backend.queued.acquire(timeout=TIMEOUT), "the request never reached the lock"
            time.sleep(HELD_SECONDS)
        timing = future.result(timeout=TIMEOUT)
    assert timing.status == 200
    assert handle.flush()
    assert value(registry, "llm_request_queue_seconds_count") == 0  # no arrival: no queue time either
    server_ttft = server_mean(registry, "llm_time_to_first_token_seconds")
    server_e2e = server_mean(registry, "llm_e2e_request_latency_seconds")
    assert timing.first_chunk - server_ttft >= HELD_SECONDS, (
        f"server TTFT {server_ttft * 1000:.1f} ms, client's first chunk {timing.first_chunk * 1000:.1f} ms"
    )
    assert timing.total - server_e2e >= HELD_SECONDS
