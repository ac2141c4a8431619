"""Rendering for scrapes: the poller's latest samples plus the exporter's own process metrics.

The poller's part is encoded at most once per change of what it holds (a new snapshot, a new count),
then served from memory: with several scrapers, or a benchmark scraping ten times a second, only the
first scrape after a collection pays for the encoding. The ``process_*`` metrics of the exporter process
are read fresh on every scrape; they are a handful of lines.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .poller import Poller
from .samples import to_families

_OPENMETRICS_EOF = b"# EOF\n"


class SnapshotCollector(Collector):
    """Renders :meth:`Poller.samples`: reads memory only, so a scrape never waits on NVML."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        return to_families(self._poller.samples())


class Exposition:
    """The body and content type of a scrape, for the ``Accept`` header the scraper sent."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller
        self._collected = CollectorRegistry(auto_describe=False)
        self._collected.register(SnapshotCollector(poller))
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[object, ...], bytes]] = {}  # content type -> (state, body)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        # One encoding at a time: concurrent scrapes after a collection wait for it, then share it.
        with self._lock:
            state = self._poller.state()
            cached = self._cache.get(content_type)
            if cached is None or cached[0] != state:
                cached = self._cache[content_type] = (state, encoder(self._collected))
        collected, own = cached[1], encoder(self._process)
        if collected.endswith(_OPENMETRICS_EOF):  # one document: only the last part keeps its terminator
            collected = collected[: -len(_OPENMETRICS_EOF)]
        return collected + own, content_type
