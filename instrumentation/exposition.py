"""Serving the in-process metrics: an HTTP endpoint, apps to mount on a server, multiprocess mode.

Three ways to get the metrics of an instrumented model to Prometheus:

* :func:`start_http_server` runs an endpoint of its own (``/metrics`` and every other path answer the
  exposition, like prometheus_client's server), built for living inside a model server: HTTP/1.1 with
  keep-alive on one asyncio loop (:mod:`inferwatch.common.httpserver`: idle, slow-request and connection
  limits) in a helper process (:mod:`.http_process`), so that no client's requests take the GIL from the
  serving loop, which only collects the registry when the helper asks, and a CPU budget; no answer
  comes from a collection of the registry older than :data:`MAX_AGE` (unless the registry typically
  takes more than ``MAX_AGE * REFRESH_SHARE`` of CPU to collect and encode: then as old as it takes to
  pay that back). Where no helper can run, the same loop runs in a thread of the serving process, its
  answers held to :data:`CPU_SHARE` of a core, clients that scrape at a normal pace ahead of those that
  scrape back to back;
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

import errno
import logging
import os
import statistics
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from inferwatch.common.authgate import guarded
from inferwatch.common.clock import SYSTEM_CLOCK, LoopClock
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
from inferwatch.common.webconfig import load_web_config
from inferwatch.instrumentation.profiling_http import DebugApp, with_debug_routes
from inferwatch.instrumentation.rendering import (
    Collected,
    Exposition,
    Variant,
    encode,
    method_not_allowed,
    render,
    restricted,
    variant_of,
)
from prometheus_client import REGISTRY, CollectorRegistry
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
#: The web config (TLS, basic auth, headers) of :func:`start_http_server`'s endpoint.
WEB_CONFIG_ENV = "INFERWATCH_WEB_CONFIG_FILE"
#: 1 (the default): :func:`start_http_server` does its HTTP work in a helper process; 0: in a thread.
HTTP_PROCESS_ENV = "INFERWATCH_HTTP_PROCESS"
#: The thread of :func:`start_http_server` in the serving process (``top -H``, ``/proc/PID/task``); the
#: helper process has the same name.
THREAD_NAME = "inferwatch-http"

#: Not 8000 (vLLM, Triton, ``transformers serve``, uvicorn/FastAPI) nor any port of Prometheus' default
#: port allocations: ``inferwatch run -- SERVER`` must not collide with the server it launches
#: (docs/serving.md, "Default ports").
DEFAULT_PORT = 8797
DEFAULT_ADDRESS = "127.0.0.1"

#: The share of one core :func:`start_http_server`'s answers may use, averaged, however it is scraped
#: (docs/serving.md, "The metrics endpoint"): collecting, encoding, compressing, writing, from when a
#: request is taken up. Parsing requests, and connections that never make one, are bounded by the HTTP
#: layer's limits instead: charging their CPU to the budget made every scrape wait for it behind a flood
#: of trickling clients (5.9 s). The serving loop's Python thread loses about as much to it through the
#: GIL (docs/benchmarks.md).
CPU_SHARE = 0.025
#: The share of one core the endpoint's helper process may spend, all of its loop's CPU counted (parsing
#: too): its CPU is not the serving loop's (no GIL is shared), so the bound is there for the machine's
#: other work, and is set where 50 scrapers a second are answered without waiting (docs/benchmarks.md).
HELPER_CPU_SHARE = 0.1
#: CPU seconds it may spend at once after a quiet spell (a burst of scrapes is answered without delay).
CPU_BURST = 0.1
#: The oldest, in seconds, the collection of the registry an answer of :func:`start_http_server` is
#: encoded from may be when the request is taken up, whatever the other clients ask for: an older one is
#: collected again (docs/serving.md, "The metrics endpoint"). Below the shortest scrape interval in
#: common use (1 s) by a quarter of a second of scheduling jitter, so that a client scraping every
#: second or less often never gets the collection it got before.
MAX_AGE = 0.75
#: The part of a core renderings (collecting and encoding) may take while every answer is collected
#: afresh: beyond (several scrapes a second), a request is answered from the last collection while it is
#: younger than :data:`MAX_AGE`. At a normal scrape rate every answer is collected for its request.
RENDER_SHARE = 0.005
#: Rendering CPU seconds that may be spent at once after a quiet spell (about ten renderings).
RENDER_BURST = 0.05
#: About the part of a core renderings may take to keep answers within :data:`MAX_AGE`, the rest of
#: :data:`CPU_SHARE` being left to answering requests: a registry whose collections, with the encodings
#: asked of them, typically take more than ``MAX_AGE * REFRESH_SHARE`` (15 ms) is collected again only
#: once that CPU is paid back at this share, and its answers are older than ``MAX_AGE`` (and say so).
REFRESH_SHARE = 0.02
#: The last collections whose CPU (with their encodings) makes the typical cost, as their median: one
#: slow collection (a garbage collection, the kernel reclaiming memory while it runs) does not hold the
#: next one back.
_COSTS_KEPT = 3
#: The endpoint's response header with the age, in seconds, of the collection the answer was encoded
#: from, as it is sent (``0.412``); answers from a collection made for an earlier request also carry
#: ``Age`` (RFC 9111, whole seconds), as a cache would.
AGE_HEADER = "Inferwatch-Collection-Age"
#: A connection that waited this long (seconds) since its last answer, or a new one, is a quiet client:
#: its request is taken up at once, ahead of clients that scrape back to back, as long as the CPU budget
#: is less than :data:`CPU_BURST` in debt (docs/serving.md, "The metrics endpoint").
QUIET = 0.5
# Connections whose last answer is remembered for QUIET: the most recent ones.
_CLIENTS_KEPT = 4096
# Answers kept per collection, one per variant of what requests ask for (format, compression, names): a
# client asking for a new variant with every request must not grow memory.
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
            status, answer = "405 Method Not Allowed", method_not_allowed()
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
            status, answer = 405, method_not_allowed()
        await _send(send, status, answer, head=scope["method"] == "HEAD")

    return metrics_app


async def _send(send: Send, status: int, answer: Exposition, head: bool) -> None:
    await respond(send, status, answer.headers, answer.body, head=head)


class _Snapshot:
    """One collection of the registry, and the answers encoded from it so far, by variant."""

    def __init__(self, families: list[Metric], taken: float) -> None:
        self.families = families
        self.taken = taken  # the monotonic clock (one for every process) when the collection began
        self.answers: dict[Variant, Exposition] = {}
        self.cost = 0.0  # CPU seconds of the collection and of what was made of it in this process
        self.shipped: bytes | None = None  # the collection as sent to the helper process, once sent

    def answer(self, variant: Variant) -> Exposition:
        answer = self.answers.get(variant)
        if answer is None:
            families = self.families
            if variant.names is not None:
                families = restricted(families, variant.names)
            answer = self.answers[variant] = encode(Collected(families), variant)
            if len(self.answers) > _RENDERS_KEPT:
                del self.answers[next(iter(self.answers))]  # the first encoded
        return answer


class Rendering(NamedTuple):
    """An answer's body and headers, and what the endpoint says about the collection it came from."""

    exposition: Exposition
    taken: float  # when its collection began (:attr:`_Snapshot.taken`)
    collected: bool  # whether it was collected for the request it answers
    cpu: float  # CPU seconds the answering thread spent making it (collecting, encoding)


class Renderings(Protocol):
    """Where :class:`_EndpointApp` gets its answers: the registry in this process (:class:`_Renderer`), or
    the serving process's collections, in the endpoint's helper process (:mod:`.http_process`)."""

    async def rendering(self, variant: Variant) -> Rendering: ...


T = TypeVar("T")


class _Renderer:
    """Collections of the registry, and what is made of them, within the renderings' CPU budgets.

    A request gets an answer encoded from one collection of the registry that every variant (format,
    compression, names) shares, each variant encoded from it once: a new collection while renderings have
    used less than :data:`RENDER_SHARE` (every answer is then collected for its request), or when the last
    one is :data:`MAX_AGE` old; else the last one. Under several scrapes a second the answers are up to
    ``MAX_AGE`` old instead of the serving process slow, whatever variants the clients ask for, and
    renderings take one collection per ``MAX_AGE`` plus one encoding per variant asked for (in the helper
    process: one collection and its serialization). Where that would be more than :data:`REFRESH_SHARE`
    of a core (a typical collection over 15 ms), a collection is kept until its cost is paid back at that
    share instead.
    """

    def __init__(
        self,
        registry: Collector,
        clock: LoopClock = SYSTEM_CLOCK,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._registry = registry
        self._now = clock.monotonic
        self._cpu = cpu  # the CPU of the thread that renders: the serving process's
        self._rendered = 0.0  # CPU seconds every collection and encoding took, together
        self._rendering = CpuBudget(RENDER_SHARE, RENDER_BURST, clock=lambda: self._rendered, wall=clock)
        self._snapshot: _Snapshot | None = None
        self._costs: deque[float] = deque(maxlen=_COSTS_KEPT)  # of the collections before the last

    def _max_age(self) -> float:
        """How old the last collection may get before a request collects again: MAX_AGE, or the time the
        typical collection's cost takes to pay back at REFRESH_SHARE, whichever is longer."""
        typical = statistics.median(self._costs) if self._costs else 0.0
        return max(MAX_AGE, typical / REFRESH_SHARE)

    async def rendering(self, variant: Variant) -> Rendering:
        answer, snapshot, collected, cpu = self.use(lambda snapshot: snapshot.answer(variant))
        return Rendering(answer, snapshot.taken, collected, cpu)

    def use(self, make: Callable[[_Snapshot], T]) -> tuple[T, _Snapshot, bool, float]:
        """``make`` of the last collection or of a new one, its CPU counted with the collection's; the
        collection, whether it was collected for this call, and the CPU seconds the call took."""
        started = self._cpu()
        try:
            snapshot, now = self._snapshot, self._now()
            collected = (
                snapshot is None or self._rendering.available() or now - snapshot.taken >= self._max_age()
            )
            if snapshot is None or collected:
                families = list(self._registry.collect())
                if snapshot is not None:
                    self._costs.append(snapshot.cost)
                snapshot = self._snapshot = _Snapshot(families, now)
            made = make(snapshot)
        finally:
            spent = self._cpu() - started
            self._rendered += spent
        snapshot.cost += spent
        return made, snapshot, collected, spent

    def charge(self, cpu: float) -> None:
        """Count ``cpu`` seconds of renderings made elsewhere (the helper process's encodings) against the
        renderings' budget, so that collections for every request stop at the same share either way."""
        self._rendered += cpu

    def reusable_until(self, snapshot: _Snapshot) -> float:
        """Until when the last collection would be used again (its ``taken`` if it would not be now)."""
        if self._rendering.available():
            return snapshot.taken
        return snapshot.taken + self._max_age()


class _EndpointApp:
    """:func:`start_http_server`'s app: the answers of :func:`make_asgi_app` within a CPU budget, from
    collections at most :data:`MAX_AGE` old (:class:`_Renderer`).

    A request waits while answers have used more than ``share`` of a core (:data:`CPU_SHARE` in the
    serving process; :data:`HELPER_CPU_SHARE` in the endpoint's helper process, counting everything its
    thread does, with ``whole_thread``), unless its connection is
    new or was :data:`QUIET` since its last answer: such a request (a scrape at a normal pace) is taken up
    at once, ahead of connections that scrape back to back, while the budget is less than
    :data:`CPU_BURST` in debt. Each answer says how old its collection is (:data:`AGE_HEADER`).
    """

    def __init__(
        self,
        renderings: Renderings,
        clock: LoopClock = SYSTEM_CLOCK,
        cpu: Callable[[], float] = time.thread_time,
        share: float = CPU_SHARE,
        whole_thread: bool = False,
    ) -> None:
        self._renderings = renderings
        self._now = clock.monotonic
        self._cpu = cpu  # where the CPU of answers is read: the thread that answers
        self._answering = 0.0  # CPU seconds answering requests took, from being taken up to being sent
        # In the serving process only answers count (charging the parsing of a flood of trickling clients
        # made every scrape wait for it); the helper process is there only to serve, so all of its loop's
        # CPU counts, flat-out scrapers' parsing included.
        counted = cpu if whole_thread else lambda: self._answering
        self._requests = CpuBudget(share, CPU_BURST, clock=counted, wall=clock)
        # Connection (client address and port) -> when its last answer was sent, most recent last.
        self._answered: OrderedDict[object, float] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _send(send, 405, method_not_allowed(), head=method == "HEAD")
            return
        client = scope.get("client")
        last = self._answered.get(client)
        await self._requests.acquire(urgent=last is None or self._now() - last >= QUIET)
        # The CPU of this answer, not of what the loop did while it waited for a rendering from the
        # serving process (other connections' requests): the rendering says what it cost this thread.
        spent = 0.0
        try:
            started = self._cpu()
            headers = request_headers(scope)
            variant = variant_of(
                headers.get("accept"),
                headers.get("accept-encoding"),
                scope.get("query_string", b"").decode("latin-1"),
            )
            spent += self._cpu() - started
            answer, taken, collected, cpu = await self._renderings.rendering(variant)
            spent += cpu
            started = self._cpu()
            age = max(0.0, self._now() - taken)
            fields = [*answer.headers, (AGE_HEADER, f"{age:.3f}")]
            if not collected:
                fields.append(("Age", str(int(age))))
            await respond(send, 200, fields, answer.body, head=method == "HEAD")
            spent += self._cpu() - started
        finally:
            self._answering += spent
            self._answered[client] = self._now()
            self._answered.move_to_end(client)
            if len(self._answered) > _CLIENTS_KEPT:
                self._answered.popitem(last=False)


@dataclass
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it (also as a context manager)."""

    address: str
    port: int
    _thread: ServerThread = field(repr=False)
    tls: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/metrics"

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
    """Serve ``registry`` over HTTP on ``addr:port``: from a helper process, or from a daemon thread.

    By default the HTTP work (connections, TLS, basic auth, answers) runs in a helper process
    (:mod:`.http_process`), and one daemon thread of this process renders the registry when the helper
    asks, at most once per :data:`MAX_AGE` plus one encoding per variant; with
    ``INFERWATCH_HTTP_PROCESS=0``, where ``sys.executable`` is not a Python interpreter (a frozen or
    embedding program), or where the helper does not start, everything runs in the thread, with answers
    held to :data:`CPU_SHARE` of a core (docs/serving.md, "The metrics endpoint").

    ``port=0`` picks a free port (read it back from ``.port`` / ``.url``). Raises :class:`PortInUseError`
    when the port is taken, :class:`ListenError` when the address cannot be listened on, and ValueError
    for a port out of range, a bad ``INFERWATCH_HTTP_PROCESS`` or an unusable web config
    (``INFERWATCH_WEB_CONFIG_FILE``: TLS, basic auth and headers in the exporter-toolkit's format, as the
    exporter's ``--web.config.file``).
    """
    validate_port(port)
    registry = registry if registry is not None else serving_registry()
    web = load_web_config(os.environ.get(WEB_CONFIG_ENV, ""))
    in_process = not helper_process_wanted(os.environ)
    try:
        sock = bind(addr, port, Limits().backlog)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                exc.errno, f"cannot serve metrics on {addr}:{port}: the address is already in use"
            ) from exc
        raise ListenError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
    # Paths under /debug/ are the on-demand profiles' (docs/profiling.md), refused unless enabled; the
    # web config's TLS, basic auth and headers cover every path.
    debug = DebugApp(multiprocess=multiprocess_dir() is not None)
    thread: ServerThread | None = None
    if not in_process:
        from inferwatch.instrumentation.http_process import HelperService

        thread = ServerThread(HelperService(sock, _Renderer(registry), debug), name=THREAD_NAME)
        try:
            thread.start()
        except (OSError, RuntimeError) as exc:
            log.warning("metrics endpoint: %s; serving from a thread of this process instead", exc)
            thread = None
    if thread is None:
        app = with_debug_routes(_EndpointApp(_Renderer(registry)), debug)
        thread = ServerThread(
            HttpServer(guarded(app, web), sock, log, ssl_context=web.ssl_context), THREAD_NAME
        )
        thread.start()
    return MetricsServer(
        address=addr, port=thread.server.port, _thread=thread, tls=web.ssl_context is not None
    )


def helper_process_wanted(environ: Mapping[str, str]) -> bool:
    """Whether :func:`start_http_server` should serve from a helper process: ``INFERWATCH_HTTP_PROCESS``
    (1, the default, or 0), and ``sys.executable`` a Python interpreter that can start one."""
    value = environ.get(HTTP_PROCESS_ENV, "1").strip()
    if value not in ("1", "0"):
        raise ValueError(f"{HTTP_PROCESS_ENV} must be 1 or 0, got {environ[HTTP_PROCESS_ENV]!r}")
    executable = os.path.basename(sys.executable or "")
    return value == "1" and not getattr(sys, "frozen", False) and executable.startswith(("python", "pypy"))
