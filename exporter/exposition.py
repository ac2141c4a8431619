"""Rendering for scrapes: the poller's latest samples plus the exporter's own process metrics.

The poller's part is encoded (:mod:`.encoding`) at most once per change of what it holds (a new
snapshot, a new count), then served from memory: with several scrapers, or a benchmark scraping ten
times a second, only the first scrape after a collection pays for the encoding, and it never waits on
NVML. The ``process_*`` metrics of the exporter process come from prometheus_client's ProcessCollector,
read on every scrape; they are a handful of lines.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import generate_latest as encode_text
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as encode_openmetrics

from .encoding import OPENMETRICS_EOF, encode
from .poller import Poller


def wants_openmetrics(accept: str | None) -> bool:
    """Whether the first of OpenMetrics and the text format named in ``Accept`` is OpenMetrics
    (Prometheus asks for OpenMetrics first)."""
    for accepted in (accept or "").split(","):
        media_type = accepted.split(";")[0].strip()
        if media_type in ("application/openmetrics-text", "text/plain"):
            return media_type == "application/openmetrics-text"
    return False


class Exposition:
    """The body and content type of a scrape, for the ``Accept`` header the scraper sent."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        self._lock = threading.Lock()
        self._cache: dict[bool, tuple[tuple[object, ...], bytes]] = {}  # openmetrics -> (state, body)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        openmetrics = wants_openmetrics(accept)
        # One encoding at a time: concurrent scrapes after a collection wait for it, then share it.
        with self._lock:
            state = self._poller.state()
            cached = self._cache.get(openmetrics)
            if cached is None or cached[0] != state:
                cached = self._cache[openmetrics] = (state, encode(self._poller.samples(), openmetrics))
        collected = cached[1]
        if openmetrics:  # one document: only the last part keeps its terminator
            collected = collected.removesuffix(OPENMETRICS_EOF.encode())
            return collected + encode_openmetrics(self._process), CONTENT_TYPE_OPENMETRICS
        return collected + encode_text(self._process), CONTENT_TYPE_PLAIN_0_0_4
