"""Collectors, one concern per module, each failing alone (node_exporter style).

A GPU collector reads one GPU through a :class:`~inferwatch.exporter.nvml.GpuContext` and runs on that
GPU's worker thread; a host collector reads the host through a :class:`.base.HostContext` on the poller
thread. Either kind only appends samples: if it raises, the poller drops what it appended in that
collection, counts the failure, and the other collectors' series are served as usual.

Each module registers its collector (:mod:`.registry`) when imported: its name, whether it runs by
default, its help, and its options with the settings they make, declared in that module alone. Importing
this package imports every one of them, so :data:`REGISTRY` is complete once it is imported: the
configuration (:mod:`..config`) imports it, when asked, to gather the collectors' options; the collectors
never import the configuration. None reads what another emitted, so the order of the imports below, which
is the order they run in, decides only the order of series in a scrape.
"""

from __future__ import annotations

from typing import Any

# The order collectors run in (and so the order of families in a scrape), kept as it was.
# isort: off
from . import identity, utilization, memory, power, thermal, clocks, clocks_events, pcie, ecc  # noqa: F401
from . import nvlink, mig, host, gpm, processes, pcie_throughput, kubernetes, xid_events  # noqa: F401

# isort: on
from .base import Configuration, GpuCollector, HostCollector, HostContext
from .registry import REGISTRY, Registration, default_collectors, default_settings
from .shared import Shared

__all__ = [
    "REGISTRY",
    "Configuration",
    "GpuCollector",
    "HostCollector",
    "HostContext",
    "Shared",
    "default_collectors",
    "default_settings",
    "gpu_collectors",
    "host_collectors",
]


def gpu_collectors(config: Configuration, shared: Shared | None = None) -> list[GpuCollector]:
    """The NVML collectors the configuration enables, in the order they run, each built with its own
    settings, over ``shared`` (made from the configuration when not given)."""
    shared = shared or Shared.from_config(config)
    return [
        collector
        for registration, settings in _enabled(config)
        if registration.gpu is not None
        for collector in registration.gpu(config, settings, shared)
    ]


def host_collectors(config: Configuration, shared: Shared | None = None) -> list[HostCollector]:
    """The psutil collectors the configuration enables, in the order they run, over ``shared``."""
    shared = shared or Shared.from_config(config)
    return [
        collector
        for registration, settings in _enabled(config)
        if registration.host is not None
        for collector in registration.host(config, settings, shared)
    ]


def _enabled(config: Configuration) -> list[tuple[Registration, Any]]:
    """The registrations that run, each with its settings (None for one without options)."""
    return [
        (registration, config.collector_settings.get(name))
        for name, registration in REGISTRY.items()
        if config.enabled(name)
    ]
