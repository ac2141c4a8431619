"""Scraping inferwatch endpoints: fetch the text exposition, parse it, and keep it as a timed snapshot.

A failed scrape is data, not an exception: ``inferwatch top`` shows an endpoint that went away as down
and keeps running, and ``inferwatch diagnose`` reports which endpoint it could not read. The samples of
several endpoints are merged into one :class:`Snapshot` with an ``instance`` label (``host:port``), the
label Prometheus adds, so that the same expressions work on a snapshot and on a Prometheus server.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.monitor.errors import ConfigError
from inferwatch.monitor.http import FetchError, fetch

DEFAULT_TIMEOUT_SECONDS = 5.0

# A label set in a canonical, hashable form: sorted (name, value) pairs.
Labels = tuple[tuple[str, str], ...]


def labels_of(mapping: dict[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True)
class Sample:
    """One sample: its full name (``_total``, ``_bucket``... included), labels and value."""

    name: str
    labels: Labels
    value: float

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass(frozen=True)
class EndpointScrape:
    """The outcome of scraping one endpoint once."""

    url: str
    instance: str
    time: float  # time.monotonic() when the answer was complete
    duration_s: float
    samples: tuple[Sample, ...] = ()
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.error is None


def instance_of(url: str) -> str:
    """``host:port`` of a URL: the ``instance`` label Prometheus would give its target."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def normalize_url(url: str) -> str:
    """Accept ``host:port`` or a base URL as well as a full metrics URL; raises
    :class:`.errors.ConfigError` naming ``url`` when it is no http(s) URL with a host."""
    given = url
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- parsed here, so that a bad port is an error now, not at every scrape
    except ValueError as exc:
        raise ConfigError(f"{given!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ConfigError(f"{given!r} is not an http(s) URL or HOST:PORT")
    if parts.path in ("", "/"):
        url = url.rstrip("/") + "/metrics"
    return url


def parse_exposition(text: str, extra_labels: dict[str, str] | None = None) -> tuple[Sample, ...]:
    """Every sample of a Prometheus text exposition, with ``extra_labels`` added to each."""
    extra = extra_labels or {}
    return tuple(
        Sample(sample.name, labels_of({**sample.labels, **extra}), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def scrape(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> EndpointScrape:
    """Scrape ``url`` once. Never raises for a network, HTTP or parse failure: it is in ``error``."""
    instance = instance_of(url)
    start = time.monotonic()
    samples: tuple[Sample, ...] = ()
    error = None
    try:
        # Plain text format 0.0.4: every inferwatch endpoint and prometheus_client serves it.
        response = fetch(url, timeout, accept="text/plain")
        if response.status != 200:
            error = f"HTTP {response.status} {response.reason}"
        else:
            samples = parse_exposition(response.text, {"instance": instance})
    except FetchError as exc:
        error = str(exc)
    except ValueError as exc:  # the parser's error for text that is not an exposition
        error = f"not a Prometheus exposition: {exc}"
    end = time.monotonic()
    return EndpointScrape(url, instance, end, end - start, samples, error)


@dataclass
class Snapshot:
    """The samples of all endpoints scraped in one round, indexed by sample name."""

    endpoints: tuple[EndpointScrape, ...]
    _by_name: dict[str, list[Sample]] = field(default_factory=dict, repr=False)
    _time_by_instance: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        index: defaultdict[str, list[Sample]] = defaultdict(list)
        for endpoint in self.endpoints:
            for sample in endpoint.samples:
                index[sample.name].append(sample)
        self._by_name = dict(index)
        self._time_by_instance = {endpoint.instance: endpoint.time for endpoint in self.endpoints}

    @property
    def time(self) -> float:
        """time.monotonic() of the round: the mean completion time of its scrapes."""
        return sum(endpoint.time for endpoint in self.endpoints) / len(self.endpoints)

    def time_of(self, sample: Sample) -> float:
        """When the endpoint ``sample`` came from answered: the time base of its rates."""
        return self._time_by_instance[sample.label("instance")]

    def samples(self, name: str) -> list[Sample]:
        return self._by_name.get(name, [])

    def names(self) -> Iterable[str]:
        return self._by_name.keys()


def scrape_round(urls: Sequence[str], timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Snapshot:
    """Scrape every URL concurrently, so that a slow endpoint does not skew the others' timing."""
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        return Snapshot(tuple(pool.map(lambda url: scrape(url, timeout), urls)))
