"""Rendering for scrapes: the poller's latest samples, the web config's reload status, and the
exporter's own process metrics.

A scrape's body is made at most once per change of what the poller holds (a new snapshot, a new count)
and per variant (text or OpenMetrics, gzip or not), then served from memory: with several scrapers, or
a benchmark scraping ten times a second, only the first scrape of a variant after a collection pays for
encoding and compressing, and none waits on NVML. The ``process_*`` metrics of the exporter process
(prometheus_client's ProcessCollector) are read with it, so they are as fresh as the last collection.
"""

from __future__ import annotations

import gzip
import itertools
import threading
from typing import NamedTuple

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import generate_latest as encode_text
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as encode_openmetrics

from inferwatch.common.negotiation import gzip_acceptable, prefers_openmetrics

from .encoding import OPENMETRICS_EOF, encode
from .poller import Poller
from .selfmetrics import ReloadStatus

# Level 1: a 62 KB scrape shrinks to a sixth in about 0.3 ms; higher levels gain little for the CPU.
_GZIP_LEVEL = 1


class Body(NamedTuple):
    """A scrape's bytes, their content type, and whether they are gzip-compressed."""

    data: bytes
    content_type: str
    gzipped: bool


class ScrapeRenderer:
    """The body of a scrape, for the ``Accept`` and ``Accept-Encoding`` headers the scraper sent."""

    def __init__(self, poller: Poller) -> None:
        self._poller = poller
        self.reloads = ReloadStatus()  # updated by the exporter's SIGHUP handler
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        self._lock = threading.Lock()
        self._state: tuple[object, ...] | None = None
        self._bodies: dict[tuple[bool, bool], Body] = {}  # (openmetrics, gzip) -> body of self._state

    def render(self, accept: str | None, accept_encoding: str | None = None) -> Body:
        """The body for these headers; raises :class:`~inferwatch.common.negotiation.NotAcceptable` when
        ``Accept`` refuses both formats."""
        variant = (prefers_openmetrics(accept), gzip_acceptable(accept_encoding))
        # One rendering at a time: concurrent scrapes after a collection wait for it, then share it.
        with self._lock:
            state = (*self._poller.state(), self.reloads.version)
            if state != self._state:
                self._state, self._bodies = state, {}
            body = self._bodies.get(variant)
            if body is None:
                body = self._bodies[variant] = self._make(*variant)
        return body

    def _make(self, openmetrics: bool, compressed: bool) -> Body:
        plain = self._bodies.get((openmetrics, False))
        if plain is None:
            plain = self._encode(openmetrics)
            if compressed:
                self._bodies[(openmetrics, False)] = plain
        if not compressed:
            return plain
        return Body(gzip.compress(plain.data, compresslevel=_GZIP_LEVEL), plain.content_type, True)

    def _encode(self, openmetrics: bool) -> Body:
        collected = encode(itertools.chain(self._poller.samples(), self.reloads.samples()), openmetrics)
        if openmetrics:  # one document: only the last part keeps its terminator
            collected = collected.removesuffix(OPENMETRICS_EOF.encode())
            return Body(collected + encode_openmetrics(self._process), CONTENT_TYPE_OPENMETRICS, False)
        return Body(collected + encode_text(self._process), CONTENT_TYPE_PLAIN_0_0_4, False)
