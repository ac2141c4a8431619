"""Serving the in-process metrics: an HTTP endpoint, apps to mount on a server, multiprocess mode.

Three ways to get the metrics of an instrumented model to Prometheus:

* :func:`start_http_server` runs an endpoint of its own (``/metrics`` and every other path answer the
  exposition, like prometheus_client's server), built for living inside a model server: HTTP/1.1 with
  keep-alive on one asyncio loop (:mod:`inferwatch.common.httpserver`: idle, slow-request and connection
  limits) in a helper process (:mod:`.helper_process`), so that no client's requests take the GIL from the
  serving loop, which only collects the registry when the helper asks, and a CPU budget; no answer comes
  from a collection of the registry older than ``MAX_AGE`` (:mod:`.app`, unless the registry
  typically takes more than ``MAX_AGE * REFRESH_SHARE`` of CPU to collect and encode: then as old as it
  takes to pay that back). Where no helper can run, the same loop runs in a thread of the serving
  process, its answers held to ``CPU_SHARE`` of a core, clients that scrape at a normal pace ahead of
  those that scrape back to back;
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
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.multiprocess import mark_process_dead as _mark_process_dead
from prometheus_client.registry import Collector

from inferwatch.common.authgate import guarded
from inferwatch.common.httpserver import (
    HttpServer,
    Limits,
    Receive,
    Scope,
    Send,
    ServerThread,
    bind,
    not_inherited_by_forks,
    request_headers,
    respond,
)
from inferwatch.common.lograte import RateLimit
from inferwatch.common.webconfig import load_web_config
from inferwatch.instrumentation.endpoint.app import EndpointApp, Renderer
from inferwatch.instrumentation.endpoint.rendering import answer
from inferwatch.instrumentation.profiling.http import DebugApp, with_debug_routes

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


log = logging.getLogger(__name__)
log.addFilter(RateLimit())


class ListenError(OSError):
    """The metrics endpoint cannot listen on the address and port asked for; ``strerror`` names them."""


class PortInUseError(ListenError):
    """The address and port the metrics endpoint should listen on are taken by another socket."""


def multiprocess_dir() -> str | None:
    """The multiprocess directory from the environment, or None outside multiprocess mode."""
    return os.environ.get(MULTIPROC_DIR_ENV) or None


def multiprocess_registry(
    path: str | os.PathLike[str] | None = None, forget_dead: bool = False
) -> CollectorRegistry:
    """A registry that sums the metrics every process wrote to ``path`` (default: the environment's).

    It holds no metrics of its own: it is meant for serving only, while the instrumented processes keep
    writing through prometheus_client's default registry. With ``forget_dead``, each collection first
    forgets the live gauges of the processes that wrote to ``path`` and no longer exist
    (:func:`mark_process_dead` for each), for a server whose workers are this process's own, in its PID
    namespace (``inferwatch run --multiprocess-dir``): not for an endpoint that serves the files of
    processes it cannot see.
    """
    path = os.fspath(path) if path is not None else multiprocess_dir()
    if not path or not os.path.isdir(path):
        raise ValueError(
            f"multiprocess mode needs an existing directory in {MULTIPROC_DIR_ENV} (got {path!r})"
        )
    registry = CollectorRegistry()
    if forget_dead:
        registry.register(_DeadProcesses(path))  # first: the sums below then leave the dead out
    MultiProcessCollector(registry, path=path)
    return registry


class _DeadProcesses:
    """A collector of no metrics: collecting it forgets the live gauges of the processes that wrote them
    to ``path`` and are gone (a killed worker's ``llm_requests_running`` would otherwise stay forever)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterable[Metric]:
        # prometheus_client's files are TYPE_PID.db, live gauges gauge_live<mode>_PID.db.
        pids = {int(name.rpartition("_")[2][:-3]) for name in os.listdir(self._path) if _LIVE.fullmatch(name)}
        for pid in pids:
            if not _exists(pid):
                _mark_process_dead(pid, self._path)
        return ()


_LIVE = re.compile(r"gauge_live\w*_\d+\.db")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


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
        status, exposition = answer(
            registry,
            method,
            environ.get("HTTP_ACCEPT"),
            environ.get("HTTP_ACCEPT_ENCODING"),
            environ.get("QUERY_STRING", ""),
        )
        headers = [*exposition.headers, ("Content-Length", str(len(exposition.body)))]
        start_response(f"{status.value} {status.phrase}", headers)
        return [b""] if method == "HEAD" else [exposition.body]

    return metrics_app


def make_asgi_app(registry: Collector | None = None) -> Callable:
    """An ASGI (HTTP) app that answers every GET and HEAD with the metrics of ``registry``."""
    registry = registry if registry is not None else serving_registry()

    async def metrics_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = request_headers(scope)
        status, exposition = answer(
            registry,
            scope["method"],
            headers.get("accept"),
            headers.get("accept-encoding"),
            scope.get("query_string", b"").decode("latin-1"),
        )
        await respond(send, status.value, exposition.headers, exposition.body, head=scope["method"] == "HEAD")

    return metrics_app


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
    (:mod:`.helper_process`), and one daemon thread of this process collects the registry when the helper
    asks, at most once per :data:`~.app.MAX_AGE` plus what the renderings' budget allows; with
    ``INFERWATCH_HTTP_PROCESS=0``, where ``sys.executable`` is not a Python interpreter (a frozen or
    embedding program), or where the helper does not start, everything runs in the thread, with answers
    held to :data:`~.app.CPU_SHARE` of a core (docs/serving.md, "The metrics endpoint").

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
        sock = not_inherited_by_forks(bind(addr, port, Limits().backlog))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                exc.errno, f"cannot serve metrics on {addr}:{port}: the address is already in use"
            ) from exc
        raise ListenError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
    # Paths under /debug/ are the on-demand profiles' (docs/profiling.md), refused unless enabled; the
    # web config's TLS, basic auth and headers cover every path.
    debug = DebugApp(
        multiprocess=multiprocess_dir() is not None,
        models_elsewhere=getattr(registry, "models_elsewhere", None),
    )
    thread: ServerThread | None = None
    if not in_process:
        from inferwatch.instrumentation.endpoint.helper_process import HelperService

        thread = ServerThread(HelperService(sock, registry, debug), name=THREAD_NAME)
        try:
            thread.start()
        except (OSError, RuntimeError) as exc:
            log.warning("metrics endpoint: %s; serving from a thread of this process instead", exc)
            thread = None
    if thread is None:
        app = with_debug_routes(EndpointApp(Renderer(registry)), debug)
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
