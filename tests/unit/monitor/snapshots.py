"""Snapshots built from real prometheus_client registries: what a scrape of a process with those metrics
would return, at a time the test chooses (so rates are exact)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from inferwatch.monitor.scrape import EndpointScrape, Snapshot, parse_exposition


def endpoint(registry: CollectorRegistry, at: float, instance: str = "serving:8797") -> EndpointScrape:
    """One endpoint's scrape of ``registry`` completed at monotonic time ``at``."""
    text = generate_latest(registry).decode()
    samples = parse_exposition(text, {"instance": instance})
    return EndpointScrape(f"http://{instance}/metrics", instance, at, 0.001, samples)


def snapshot(*endpoints: EndpointScrape) -> Snapshot:
    return Snapshot(tuple(endpoints))
