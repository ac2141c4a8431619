"""Observations made in batches give the same exposition as prometheus_client observing value by value."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from inferwatch.instrumentation.metrics.observations import Observations, observe_many, observe_repeated

BUCKETS = (0.001, 0.01, 0.1, 1.0)
# On every bound, between bounds, under the first, over the last, and repeated values.
VALUES = [0.0, 0.0005, 0.001, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.5, 1.0, 1.0000001, 7.0, 0.001]


def histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("x_seconds", "x.", ["model"], buckets=BUCKETS, registry=registry).labels("m")


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text exposition without ``_created`` (the two histograms were made at different times)."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("value", [0.0005, 0.001, 0.05, 7.0, math.nan])
def test_observe_repeated_equals_observing_the_value_that_many_times(value: float) -> None:
    one_by_one, batched, gathered = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    single = histogram(one_by_one)
    for _ in range(5):
        single.observe(value)
    observe_repeated(histogram(batched), value, 5)
    observations = Observations()
    child = histogram(gathered)
    observations.observe_repeated(child, value, 2)
    observations.observe_repeated(child, value, 3)
    observations.flush()
    assert exposition(batched) == exposition(one_by_one)
    assert exposition(gathered) == exposition(one_by_one)


@pytest.mark.parametrize(
    "values",
    [
        VALUES,
        [math.nan],
        [0.5, math.nan, 0.001, 7.0],
        [0.002, 0.003, 0.005],  # one bucket
        [math.inf, 0.0, 0.0],  # the first and the +Inf bucket
        [-math.inf, 0.1, 0.1],
        [],
    ],
)
def test_observe_many_equals_observing_each_value(values: list[float]) -> None:
    one_by_one, batched = CollectorRegistry(), CollectorRegistry()
    single = histogram(one_by_one)
    for value in values:
        single.observe(value)
    observe_many(histogram(batched), values)
    assert exposition(batched) == exposition(one_by_one)


def test_a_replaced_observe_still_sees_every_value() -> None:
    seen: list[float] = []
    child = histogram(CollectorRegistry())
    original = child.observe

    def record(value: float) -> None:
        seen.append(value)
        original(value)

    child.observe = record
    observe_many(child, VALUES)
    observe_repeated(child, 0.5, 2)
    assert seen == [*VALUES, 0.5, 0.5]


def test_a_batch_is_made_once_and_starts_empty_again() -> None:
    registry = CollectorRegistry()
    child = histogram(registry)
    observations = Observations()
    for value in VALUES[:3]:
        observations.observe(child, value)
    assert registry.get_sample_value("x_seconds_count", {"model": "m"}) == 0
    observations.flush()
    observations.flush()
    assert registry.get_sample_value("x_seconds_count", {"model": "m"}) == 3


def test_multiprocess_values_take_a_batch(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In multiprocess mode the bucket values are memory-mapped files: ``inc`` by a count works there too."""
    from prometheus_client import values
    from prometheus_client.multiprocess import MultiProcessCollector

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.get_value_class())
    observe_many(histogram(CollectorRegistry()), VALUES)
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(tmp_path))
    assert merged.get_sample_value("x_seconds_count", {"model": "m"}) == len(VALUES)
    assert merged.get_sample_value("x_seconds_bucket", {"model": "m", "le": "0.001"}) == 5
