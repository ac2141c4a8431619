"""``transformers serve`` under ``inferwatch run``: the integration chosen by what the installed
transformers has, not by its version number.

transformers rewrites its server every few releases; each layout it has had is one small module here,
with a ``detect(utils, manager)`` that looks for the names it hooks and an ``install`` that hooks them:

* :mod:`.threaded` (5.17-5.24): the model in the serving process, behind one inference thread;
* :mod:`.engine` (5.25 on): the model in an engine process, the HTTP API in one or more API processes.

Nothing else in inferwatch knows either. Every layout shares the HTTP edge: ``build_server``'s app gets
:class:`~inferwatch.instrumentation.edge.middleware.ArrivalMiddleware` (first content, last byte, clients
that leave, refused requests), and a process that serves it reports on the program's endpoint
(:func:`~inferwatch.instrumentation.endpoint.program.join_program`).

A layout none of them knows is said once, in one line naming the transformers version and what is
missing, and on ``/metrics`` (``inferwatch_run_serve_integration_info{integration="unknown",
coverage="partial"}``); the models are still measured at ``generate`` and ``forward`` in whatever process
builds them, and the HTTP edge where ``build_server`` is found. This module does not import torch.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from types import ModuleType
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import GaugeMetricFamily

from inferwatch.instrumentation.launcher.transformers_serve import engine, threaded
from inferwatch.instrumentation.launcher.transformers_serve.common import logger

#: The modules whose import the launcher waits for: the app factory, and the model manager (imported
#: after the runners' module, so that one is complete when the layout is chosen).
SERVER_MODULE = "transformers.cli.serving.server"
MANAGER_MODULE = "transformers.cli.serving.model_manager"
UTILS_MODULE = "transformers.cli.serving.utils"
LAYOUTS = (threaded, engine)
UNKNOWN = "unknown"
_chosen: ModuleType | None = None  # the layout installed in this process


class _IntegrationInfo:
    """``inferwatch_run_serve_integration_info``: which integration this process uses, once chosen."""

    def __init__(self) -> None:
        self.labels: dict[str, str] | None = None

    def collect(self) -> list[GaugeMetricFamily]:
        if self.labels is None:
            return []
        family = GaugeMetricFamily(
            "inferwatch_run_serve_integration_info",
            "1: the transformers serve integration inferwatch run uses, the transformers version it found, "
            "and its coverage (full; partial: models and HTTP edge only).",
            labels=list(self.labels),
        )
        family.add_metric(list(self.labels.values()), 1)
        return [family]

    def describe(self) -> list[GaugeMetricFamily]:
        return []


_info = _IntegrationInfo()
_info_lock = threading.Lock()


def _announce(integration: str) -> None:
    import transformers

    with _info_lock:
        if _info.labels is None:
            REGISTRY.register(_info)
        _info.labels = {
            "integration": integration,
            "transformers_version": str(getattr(transformers, "__version__", "")),
            "coverage": "partial" if integration == UNKNOWN else "full",
        }


def on_manager_module(manager: ModuleType) -> str:
    """Choose and install the layout of the serving modules; the integration's name. Never raises."""
    try:
        utils = sys.modules[UTILS_MODULE]
        layout = next((layout for layout in LAYOUTS if layout.detect(utils, manager)), None)
        if layout is not None:
            global _chosen
            layout.install(utils, manager)
            _chosen = layout
            _announce(layout.NAME)
            return layout.NAME
    except Exception:
        logger.warning("inferwatch run: could not hook transformers serve", exc_info=True)
    _announce(UNKNOWN)
    if _is_first_process():
        import transformers

        logger.warning(
            "inferwatch run: transformers %s's `transformers serve` has a layout inferwatch does not know: "
            "requests are not timed from their arrival (no queue time, waiting requests or cancellations "
            "from the engine); models are measured at generate and forward in whatever process runs them, "
            "and the HTTP edge where its app is found",
            getattr(transformers, "__version__", "?"),
        )
    return UNKNOWN


def _is_first_process() -> bool:
    """Whether this is the program's first process (the one that says what it found, once)."""
    from inferwatch.instrumentation.launcher.command import SERVER_PID_ENV

    return os.environ.get(SERVER_PID_ENV) in (None, str(os.getpid()))


def on_server_module(server: ModuleType) -> None:
    """Add the middleware to every app ``build_server`` makes. Never raises."""
    try:
        build_server = server.build_server
        server.build_server = _with_edge(build_server)
    except Exception:
        logger.warning("inferwatch run: could not hook transformers serve's app", exc_info=True)


def _with_edge(build_server: Any) -> Any:
    @functools.wraps(build_server)
    def build_server_with_arrivals(*args: Any, **kwargs: Any) -> Any:
        app = build_server(*args, **kwargs)
        try:
            from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware
            from inferwatch.instrumentation.endpoint.program import join_program
            from inferwatch.instrumentation.launcher.autoinstrument import launch_settings

            name = launch_settings().model_name
            edge_model_name = getattr(_chosen, "edge_model_name", None)
            if name is None and edge_model_name is not None:
                name = edge_model_name(args, kwargs)
            app.add_middleware(ArrivalMiddleware, model_name=name)
            join_program("api")
        except Exception:
            logger.warning(
                "inferwatch run: transformers serve's requests are timed from generate", exc_info=True
            )
        return app

    return build_server_with_arrivals
