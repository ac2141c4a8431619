"""The exporter's own encoder writes exactly what prometheus_client writes for the same samples."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from inferwatch.exporter.encoding import encode
from inferwatch.exporter.samples import FamilySpec, Sample, gpu_counter, gpu_gauge
from tests.unit.exporter.conftest import MakePoller

GAUGE = gpu_gauge(
    "test_zone_info", 'A gauge whose help has a "quote", a \\ backslash\nand a newline.', "b", "a"
)
COUNTER = gpu_counter("test_events_total", "A counter.", "kind")
BARE = FamilySpec("test_bare", "gauge", "No labels.")
AWKWARD = ('say "hi"', "back\\slash", "line\nbreak", "ünïcødé", "")
VALUES = (0.0, 1.0, -2.5, 1e-9, 123456789.0, 1.5e300, math.inf, -math.inf, 4.2e21)


def reference(samples: list[Sample]) -> CollectorRegistry:
    """The same samples the way prometheus_client's own families hold them."""

    class Families(Collector):
        def collect(self) -> Iterator[Metric]:
            families: dict[FamilySpec, Metric] = {}
            for spec, labels, value in samples:
                if spec not in families:
                    family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
                    families[spec] = family_type(spec.name, spec.help, labels=spec.labels)
                families[spec].add_metric(labels, value)
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return registry


def test_byte_identical_to_prometheus_client_in_both_formats() -> None:
    samples = [Sample(BARE, (), 7.0)]
    for i, value in enumerate(VALUES):
        samples.append(Sample(GAUGE, (str(i), f"GPU-{i}", AWKWARD[i % len(AWKWARD)], "x"), value))
        samples.append(Sample(COUNTER, (str(i), f"GPU-{i}", AWKWARD[-1 - i % len(AWKWARD)]), abs(value)))
    registry = reference(samples)
    assert encode(samples, openmetrics=False) == generate_latest(registry)
    assert encode(samples, openmetrics=True) == generate_openmetrics(registry)


def test_byte_identical_for_a_real_snapshot(make_poller: MakePoller) -> None:
    poller = make_poller()
    poller.collect()
    samples = list(poller.samples())
    assert len(samples) > 100
    registry = reference(samples)
    assert encode(samples, openmetrics=False) == generate_latest(registry)
    assert encode(samples, openmetrics=True) == generate_openmetrics(registry)
