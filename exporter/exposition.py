"""The bridge to prometheus_client: a registry whose collector renders the poller's latest samples."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .poller import Poller
from .samples import to_families


class SnapshotCollector(Collector):
    """Renders :meth:`Poller.samples`: reads memory only, so a scrape never waits on NVML."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        return to_families(self._poller.samples())


def build_registry(poller: Poller) -> CollectorRegistry:
    """The exporter's registry: GPU, host and self metrics, plus the standard ``process_*`` metrics of
    the exporter process (its own CPU and memory footprint)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(poller))
    ProcessCollector(registry=registry)
    return registry
