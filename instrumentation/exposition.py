"""Serving the in-process metrics: an HTTP endpoint, apps to mount on a server, multiprocess mode.

Three ways to get the metrics of an instrumented model to Prometheus:

* :func:`start_http_server` runs an endpoint of its own in one background thread (``/metrics`` and every
  other path answer the exposition, like prometheus_client's server), built for living inside a model
  server: HTTP/1.1 with keep-alive on one asyncio loop (:mod:`inferwatch.common.httpserver`: idle,
  slow-request and connection limits), and a CPU budget, so that however hard it is scraped it takes
  no more than :data:`CPU_SHARE` of a core from the serving loop;
* :func:`make_wsgi_app` / :func:`make_asgi_app` return an app to mount on the serving framework's own
  server (Flask, Django, FastAPI, Starlette...), so no second port is needed;
* in a server with several worker processes (gunicorn, uvicorn ``--workers``), prometheus_client's
  multiprocess mode: every worker writes its metrics to memory-mapped files in the directory named by
  ``PROMETHEUS_MULTIPROC_DIR`` and the endpoint sums them up (:func:`multiprocess_registry`).

All three answer GET and HEAD (405 otherwise), choose between the text format and OpenMetrics by the
``q`` values of ``Accept`` (prometheus_client's encoders and their versions and escapings), and
compress with gzip when ``Accept-Encoding`` accepts it; ``name[]`` in the query string restricts the
answer to the samples of those names. The apps collect the registry for every request. Everything
here resolves ``registry=None`` through :func:`serving_registry`, so the same call serves the right
registry in both single-process and multiprocess mode.
"""

from __future__ import annotations

import copy
import errno
import gzip
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from inferwatch.common.httpserver import (
    CpuBudget,
    HttpServer,
    Limits,
    Receive,
    Scope,
    Send,
    ServerThread,
    bind,
    request_headers,
    respond,
)
from inferwatch.common.lograte import RateLimit
from inferwatch.common.negotiation import OPENMETRICS, TEXT, choose_media_type, gzip_acceptable
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.multiprocess import mark_process_dead as _mark_process_dead
from prometheus_client.registry import Collector

__all__ = [
    "MULTIPROC_DIR_ENV",
    "ListenError",
    "MetricsServer",
    "PortInUseError",
    "make_asgi_app",
    "make_wsgi_app",
    "mark_process_dead",
    "multiprocess_dir",
    "multiprocess_registry",
    "serving_registry",
    "start_http_server",
]

#: prometheus_client reads this variable when it is imported: it must be set before the first import.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: Not 8000 (vLLM, Triton, ``transformers serve``, uvicorn/FastAPI) nor any port of Prometheus' default
#: port allocations: ``inferwatch run -- SERVER`` must not collide with the server it launches
#: (docs/serving.md, "Default ports").
DEFAULT_PORT = 8797
DEFAULT_ADDRESS = "127.0.0.1"

#: The share of one core :func:`start_http_server`'s thread may use, averaged, however it is scraped
#: (docs/serving.md, "The metrics endpoint"): parsing, rendering, compressing. The serving loop's Python
#: thread loses about as much to it through the GIL (docs/benchmarks.md).
CPU_SHARE = 0.025
#: CPU seconds it may spend at once after a quiet spell (a burst of scrapes is answered without delay).
CPU_BURST = 0.1
#: The part of a core renderings may take (the rest of CPU_SHARE answers requests): beyond, a rendering
#: is served again to requests of the same kind instead of a new one (a 5 ms rendering: one a second).
RENDER_SHARE = 0.005
#: Rendering CPU seconds that may be spent at once after a quiet spell (about ten renderings).
RENDER_BURST = 0.05
# Level 1: a fifth of the size for a fraction of the CPU of gzip's default level 9.
_GZIP_LEVEL = 1
# Renderings kept for reuse, one per variant of request headers: a client sending a new Accept header
# with every request must not grow memory.
_RENDERS_KEPT = 8

log = logging.getLogger(__name__)
log.addFilter(RateLimit())


class ListenError(OSError):
    """The metrics endpoint cannot listen on the address and port asked for; ``strerror`` names them."""


class PortInUseError(ListenError):
    """The address and port the metrics endpoint should listen on are taken by another socket."""


def multiprocess_dir() -> str | None:
    """The multiprocess directory from the environment, or None outside multiprocess mode."""
    return os.environ.get(MULTIPROC_DIR_ENV) or None


def multiprocess_registry(path: str | os.PathLike[str] | None = None) -> CollectorRegistry:
    """A registry that sums the metrics every process wrote to ``path`` (default: the environment's).

    It holds no metrics of its own: it is meant for serving only, while the instrumented processes keep
    writing through prometheus_client's default registry.
    """
    path = os.fspath(path) if path is not None else multiprocess_dir()
    if not path or not os.path.isdir(path):
        raise ValueError(
            f"multiprocess mode needs an existing directory in {MULTIPROC_DIR_ENV} (got {path!r})"
        )
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    return registry


def serving_registry() -> Collector:
    """What an endpoint serves by default: the multiprocess aggregate in multiprocess mode, else the
    default registry, where :func:`inferwatch.instrumentation.instrument` registers its metrics."""
    return multiprocess_registry() if multiprocess_dir() else REGISTRY


def mark_process_dead(pid: int, path: str | os.PathLike[str] | None = None) -> None:
    """Forget the live gauges (``livesum``, ``livemax``...) of a worker that exited.

    Call it from the server's worker-exit hook, e.g. gunicorn's ``child_exit(server, worker)``; counters
    and histograms of the dead worker stay in the sums, as they should.
    """
    path = os.fspath(path) if path is not None else multiprocess_dir()
    if not path:
        raise ValueError(f"mark_process_dead needs a path or {MULTIPROC_DIR_ENV} in the environment")
    _mark_process_dead(pid, path)


class Exposition(NamedTuple):
    """A rendered answer: body and headers (Content-Type, and Content-Encoding when compressed)."""

    body: bytes
    headers: tuple[tuple[str, str], ...]


class _Variant(NamedTuple):
    """What the answer to a request depends on: requests that ask for the same variant get the same bytes."""

    media: str  # the ``Accept`` entry that chose the format, for prometheus_client's choose_encoder
    gzip: bool
    names: frozenset[str] | None  # ``name[]`` of the query string; None: every metric


def _variant(accept: str | None, accept_encoding: str | None, query: str) -> _Variant:
    chosen = choose_media_type(accept, (TEXT, OPENMETRICS))
    names = parse_qs(query).get("name[]")
    return _Variant(
        chosen[1] if chosen else "", gzip_acceptable(accept_encoding), frozenset(names) if names else None
    )


class _Collected:
    """Metric families collected once, as a collector: prometheus_client's encoders take anything with
    ``collect()``, so one collection can be encoded in every format."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _restricted(families: Iterable[Metric], names: frozenset[str]) -> list[Metric]:
    """The families with only their samples named in ``names``, those left with none dropped: what
    prometheus_client's restricted registry serves (``name[]``), for any collector, with units kept."""
    out = []
    for family in families:
        samples = [sample for sample in family.samples if sample.name in names]
        if samples:
            kept = copy.copy(family)
            kept.samples = samples
            out.append(kept)
    return out


def _encode(collected: Collector, variant: _Variant) -> Exposition:
    encoder, content_type = choose_encoder(variant.media)
    body = encoder(collected)
    headers = [("Content-Type", content_type)]
    if variant.gzip:
        body = gzip.compress(body, compresslevel=_GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    return Exposition(body, tuple(headers))


def render(
    registry: Collector, accept: str | None, accept_encoding: str | None, query: str = ""
) -> Exposition:
    """The exposition of ``registry``, collected now, as the request headers ask for it; ``name[]`` in
    the query string restricts it to the samples of those names, as with prometheus_client."""
    variant = _variant(accept, accept_encoding, query)
    if variant.names is not None:
        registry = _Collected(_restricted(registry.collect(), variant.names))
    return _encode(registry, variant)


def _method_not_allowed() -> Exposition:
    return Exposition(b"Method not allowed\n", (("Content-Type", "text/plain"), ("Allow", "GET, HEAD")))


def make_wsgi_app(registry: Collector | None = None) -> Callable:
    """A WSGI app that answers every GET and HEAD with the metrics of ``registry``."""
    registry = registry if registry is not None else serving_registry()

    def metrics_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method in ("GET", "HEAD"):
            status, answer = (
                "200 OK",
                render(
                    registry,
                    environ.get("HTTP_ACCEPT"),
                    environ.get("HTTP_ACCEPT_ENCODING"),
                    environ.get("QUERY_STRING", ""),
                ),
            )
        else:
            status, answer = "405 Method Not Allowed", _method_not_allowed()
        start_response(status, [*answer.headers, ("Content-Length", str(len(answer.body)))])
        return [b""] if method == "HEAD" else [answer.body]

    return metrics_app


def make_asgi_app(registry: Collector | None = None) -> Callable:
    """An ASGI (HTTP) app that answers every GET and HEAD with the metrics of ``registry``."""
    registry = registry if registry is not None else serving_registry()

    async def metrics_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = request_headers(scope)
        if scope["method"] in ("GET", "HEAD"):
            status, answer = (
                200,
                render(
                    registry,
                    headers.get("accept"),
                    headers.get("accept-encoding"),
                    scope.get("query_string", b"").decode("latin-1"),
                ),
            )
        else:
            status, answer = 405, _method_not_allowed()
        await _send(send, status, answer, head=scope["method"] == "HEAD")

    return metrics_app


async def _send(send: Send, status: int, answer: Exposition, head: bool) -> None:
    await respond(send, status, answer.headers, answer.body, head=head)


class _EndpointApp:
    """:func:`start_http_server`'s app: :func:`make_asgi_app` within two CPU budgets.

    Every request waits while the loop thread has used more than :data:`CPU_SHARE`. Every answer is
    rendered afresh while renderings have used less than :data:`RENDER_SHARE`; beyond (several scrapes a
    second), a request gets the last rendering of its variant (format, compression, names), at most the
    time one rendering takes to pay back old (a 5 ms rendering: 1 s). The answers are then a little old
    instead of the serving process slow; at a normal scrape rate they are always fresh.
    """

    def __init__(self, registry: Collector) -> None:
        self._registry = registry
        self._requests = CpuBudget(CPU_SHARE, CPU_BURST)
        self._rendered = 0.0  # CPU seconds every rendering took, together
        self._rendering = CpuBudget(RENDER_SHARE, RENDER_BURST, clock=lambda: self._rendered)
        self._renders: dict[tuple[str, str, str], Exposition] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _send(send, 405, _method_not_allowed(), head=method == "HEAD")
            return
        await self._requests.acquire()
        headers = request_headers(scope)
        variant = (
            headers.get("accept", ""),
            headers.get("accept-encoding", ""),
            scope.get("query_string", b"").decode("latin-1"),
        )
        await _send(send, 200, self._exposition(variant), head=method == "HEAD")

    def _exposition(self, variant: tuple[str, str, str]) -> Exposition:
        previous = self._renders.get(variant)
        if previous is not None and not self._rendering.available():
            return previous
        started = time.thread_time()
        answer = render(self._registry, *variant)
        self._rendered += time.thread_time() - started
        self._renders.pop(variant, None)
        self._renders[variant] = answer
        if len(self._renders) > _RENDERS_KEPT:
            del self._renders[next(iter(self._renders))]  # the least recently rendered
        return answer


@dataclass
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it (also as a context manager)."""

    address: str
    port: int
    _thread: ServerThread = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port; safe to call more than once."""
        self._thread.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def validate_port(port: object) -> int:
    """``port`` as an int in 0..65535 (0: any free port), else ValueError naming it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port!r}")
    return port


def start_http_server(
    port: int = DEFAULT_PORT, addr: str = DEFAULT_ADDRESS, registry: Collector | None = None
) -> MetricsServer:
    """Serve ``registry`` over HTTP on ``addr:port`` from a daemon thread.

    ``port=0`` picks a free port (read it back from ``.port`` / ``.url``). Raises :class:`PortInUseError`
    when the port is taken, :class:`ListenError` when the address cannot be listened on, and ValueError
    for a port out of range.
    """
    validate_port(port)
    registry = registry if registry is not None else serving_registry()
    try:
        sock = bind(addr, port, Limits().backlog)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                exc.errno, f"cannot serve metrics on {addr}:{port}: the address is already in use"
            ) from exc
        raise ListenError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
    app = _EndpointApp(registry)
    thread = ServerThread(HttpServer(app, sock, log), name="inferwatch-http")
    thread.start()
    return MetricsServer(address=addr, port=thread.server.port, _thread=thread)
