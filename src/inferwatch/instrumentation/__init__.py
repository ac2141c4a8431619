"""In-process instrumentation of PyTorch / transformers inference.

Install with ``pip install 'inferwatch[instrumentation]'``.

::

    from inferwatch.instrumentation import instrument, start_http_server
    handle = instrument(model)          # llm_* metrics on prometheus_client's default registry
    start_http_server()                 # http://127.0.0.1:8797/metrics
    model.generate(...)                 # timed, counted, KV cache measured
    handle.remove()                     # every hook gone

Every public name is here; the subpackages (docs/architecture.md) are internal and may move. The names are
imported lazily, so importing a torch-free part (the endpoint, the configuration) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferwatch.instrumentation.config import InstrumentConfig
    from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware, WSGIArrivalMiddleware
    from inferwatch.instrumentation.endpoint.server import (
        make_asgi_app,
        make_wsgi_app,
        mark_process_dead,
        start_http_server,
    )
    from inferwatch.instrumentation.instrumenting import InstrumentationHandle, instrument
    from inferwatch.instrumentation.model.criteria import stop_on_disconnect
    from inferwatch.instrumentation.timing.arrival import ARRIVAL, request_arrival
    from inferwatch.instrumentation.tracking import RequestTracker, track_request

_EXPORTS = {
    "InstrumentConfig": "inferwatch.instrumentation.config",
    "InstrumentationHandle": "inferwatch.instrumentation.instrumenting",
    "instrument": "inferwatch.instrumentation.instrumenting",
    "RequestTracker": "inferwatch.instrumentation.tracking",
    "track_request": "inferwatch.instrumentation.tracking",
    "start_http_server": "inferwatch.instrumentation.endpoint.server",
    "make_asgi_app": "inferwatch.instrumentation.endpoint.server",
    "make_wsgi_app": "inferwatch.instrumentation.endpoint.server",
    "mark_process_dead": "inferwatch.instrumentation.endpoint.server",
    "ArrivalMiddleware": "inferwatch.instrumentation.edge.middleware",
    "WSGIArrivalMiddleware": "inferwatch.instrumentation.edge.middleware",
    "ARRIVAL": "inferwatch.instrumentation.timing.arrival",
    "request_arrival": "inferwatch.instrumentation.timing.arrival",
    "stop_on_disconnect": "inferwatch.instrumentation.model.criteria",
}

__all__ = [
    "ARRIVAL",
    "ArrivalMiddleware",
    "InstrumentConfig",
    "InstrumentationHandle",
    "RequestTracker",
    "WSGIArrivalMiddleware",
    "instrument",
    "make_asgi_app",
    "make_wsgi_app",
    "mark_process_dead",
    "request_arrival",
    "start_http_server",
    "stop_on_disconnect",
    "track_request",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
