"""Serving the in-process metrics: an HTTP endpoint, apps to mount on a server, multiprocess mode.

Three ways to get the metrics of an instrumented model to Prometheus:

* :func:`start_http_server` runs a small threaded HTTP server of its own (``/metrics`` and every other
  path answer the exposition, like prometheus_client's server);
* :func:`make_wsgi_app` / :func:`make_asgi_app` return an app to mount on the serving framework's own
  server (Flask, Django, FastAPI, Starlette...), so no second port is needed;
* in a server with several worker processes (gunicorn, uvicorn ``--workers``), prometheus_client's
  multiprocess mode: every worker writes its metrics to memory-mapped files in the directory named by
  ``PROMETHEUS_MULTIPROC_DIR`` and the endpoint sums them up (:func:`multiprocess_registry`).

Everything here resolves ``registry=None`` through :func:`serving_registry`, so the same call serves the
right registry in both single-process and multiprocess mode.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry
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
    """A WSGI app that answers every request with the metrics of ``registry``."""
    return prometheus_client.make_wsgi_app(registry if registry is not None else serving_registry())


def make_asgi_app(registry: Collector | None = None) -> Callable:
    """An ASGI (HTTP) app that answers every request with the metrics of ``registry``."""
    return prometheus_client.make_asgi_app(registry if registry is not None else serving_registry())


@dataclass
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it (also as a context manager)."""

    address: str
    port: int
    _httpd: WSGIServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port; safe to call more than once."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

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
    when the port is taken and ValueError for a port out of range.
    """
    validate_port(port)
    registry = registry if registry is not None else serving_registry()
    try:
        httpd, thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                exc.errno, f"cannot serve metrics on {addr}:{port}: the address is already in use"
            ) from exc
        raise
    return MetricsServer(address=addr, port=httpd.server_address[1], _httpd=httpd, _thread=thread)
