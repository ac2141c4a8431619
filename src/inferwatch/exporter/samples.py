"""Metric descriptions and the plain samples collectors produce, turned into Prometheus families at scrape.

Collectors never touch prometheus_client objects: they append :class:`Sample` tuples to a list. The poller
freezes those lists into a snapshot, which :mod:`.encoding` writes out only when ``/metrics`` is scraped.
Keeping collection and exposition apart is what lets a scrape answer without waiting on NVML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

GPU_LABELS = ("gpu", "uuid")


@dataclass(frozen=True, eq=False)
class FamilySpec:
    """One metric family as users see it: counters are named with their ``_total`` suffix.

    Specs compare and hash by identity: each is defined once, next to the collector that fills it.
    """

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")


def gpu_gauge(name: str, help_: str, *labels: str) -> FamilySpec:
    """A per-GPU gauge: ``gpu`` and ``uuid`` come first, then ``labels``."""
    return FamilySpec(name, "gauge", help_, GPU_LABELS + labels)


def gpu_counter(name: str, help_: str, *labels: str) -> FamilySpec:
    """A per-GPU counter: ``gpu`` and ``uuid`` come first, then ``labels``."""
    return FamilySpec(name, "counter", help_, GPU_LABELS + labels)


class Sample(NamedTuple):
    spec: FamilySpec
    labels: tuple[str, ...]
    value: float
