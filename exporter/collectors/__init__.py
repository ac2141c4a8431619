"""Collectors, one concern per module, each failing alone (node_exporter style).

A GPU collector reads one GPU through a :class:`~inferwatch.exporter.nvml.GpuContext` and runs on that
GPU's worker thread; a host collector reads the host through a :class:`.base.HostContext` on the poller
thread. Either kind only appends samples: if it raises, the poller drops what it appended in that
collection, counts the failure, and the other collectors' series are served as usual.

Each module registers its collector (:mod:`.registry`) when imported: its name, whether it runs by
default, its help and its options. None reads what another emitted, so the order of the imports below,
which is the order they run in, decides only the order of series in a scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The order collectors run in (and so the order of families in a scrape), kept as it was.
# isort: off
from . import identity, utilization, memory, power, thermal, clocks, clocks_events, pcie, ecc  # noqa: F401
from . import nvlink, mig, host, gpm, processes, pcie_throughput, kubernetes, xid  # noqa: F401

# isort: on
from .base import GpuCollector, HostCollector, HostContext
from .registry import REGISTRY, Registration
from .shared import Shared

if TYPE_CHECKING:
    from ..config import ExporterConfig

__all__ = [
    "REGISTRY",
    "GpuCollector",
    "HostCollector",
    "HostContext",
    "Shared",
    "gpu_collectors",
    "host_collectors",
]


def gpu_collectors(config: ExporterConfig, shared: Shared | None = None) -> list[GpuCollector]:
    """The NVML collectors the configuration enables, in the order they run, over ``shared`` (made from
    the configuration when not given)."""
    shared = shared or Shared.from_config(config)
    return [c for r in _enabled(config) if r.gpu is not None for c in r.gpu(config, shared)]


def host_collectors(config: ExporterConfig, shared: Shared | None = None) -> list[HostCollector]:
    """The psutil collectors the configuration enables, in the order they run, over ``shared``."""
    shared = shared or Shared.from_config(config)
    return [c for r in _enabled(config) if r.host is not None for c in r.host(config, shared)]


def _enabled(config: ExporterConfig) -> list[Registration]:
    return [registration for name, registration in REGISTRY.items() if config.enabled(name)]
