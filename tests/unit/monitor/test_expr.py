"""Expressions evaluated on two scrapes, and the PromQL they stand for."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inferwatch.common.promql import Selector, eq
from inferwatch.monitor.expr import Gauge as GaugeExpr
from inferwatch.monitor.expr import Quantile, Rate, Ratio, bucket_quantile, histogram_mean
from tests.unit.monitor.snapshots import endpoint, snapshot

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # rank 20 falls in (0.1, 0.2], 10 of its 20 observations in: halfway.
        (0.5, {0.1: 10, 0.2: 30, 0.5: 40, INF: 40}, 0.15),
        # rank 39.6 in (0.2, 0.5]: 9.6 of 10.
        (0.99, {0.1: 10, 0.2: 30, 0.5: 40, INF: 40}, 0.2 + 0.3 * 0.96),
        # the first bucket starts at zero.
        (0.5, {1.0: 10, INF: 10}, 0.5),
        # a rank in the +Inf bucket: the highest finite bound.
        (0.9, {0.1: 5, INF: 10}, 0.1),
        # a non-positive first bound is returned as is.
        (0.5, {-1.0: 10, INF: 10}, -1.0),
        # cumulative counts that dip (a scrape mid-update) are repaired upwards.
        (0.5, {0.1: 10, 0.2: 8, 0.5: 20, INF: 20}, 0.1),
    ],
)
def test_bucket_quantile_interpolates_like_prometheus(q: float, buckets: dict, expected: float) -> None:
    assert bucket_quantile(q, buckets) == pytest.approx(expected)


@pytest.mark.parametrize("buckets", [{}, {0.1: 3, 1.0: 5}, {0.1: 0, INF: 0}, {INF: 4}])
def test_bucket_quantile_without_an_answer(buckets: dict) -> None:
    assert bucket_quantile(0.5, buckets) is None


def test_promql_text() -> None:
    sm = Selector("gpu_clock_hz", (eq("clock", "sm"),))
    assert (
        GaugeExpr(sm, ("instance", "gpu"), "max").promql("1m")
        == 'max by (instance, gpu) (gpu_clock_hz{clock="sm"})'
    )
    assert (
        Rate(Selector("llm_generation_tokens_total"), ("model",)).promql("30s")
        == "sum by (model) (rate(llm_generation_tokens_total[30s]))"
    )
    ttft_p99 = Quantile(0.99, Selector("llm_time_to_first_token_seconds"), ("instance", "model"))
    assert (
        ttft_p99.query().render("1m") == "histogram_quantile(0.99, sum by (instance, model, le) "
        "(rate(llm_time_to_first_token_seconds_bucket[1m])))"
    )
    # Over 100 columns, the text a user is shown is broken the way Prometheus's formatter breaks it.
    assert ttft_p99.promql("1m") == (
        "histogram_quantile(\n  0.99,\n"
        "  sum by (instance, model, le) (rate(llm_time_to_first_token_seconds_bucket[1m]))\n)"
    )
    assert histogram_mean(Selector("x_seconds"), ("model",)).promql("5s") == (
        "sum by (model) (rate(x_seconds_sum[5s])) / sum by (model) (rate(x_seconds_count[5s]))"
    )


def test_rate_is_the_increase_over_the_time_between_scrapes() -> None:
    registry = CollectorRegistry()
    tokens = Counter("llm_generation_tokens", "", ["model"], registry=registry)
    tokens.labels("a").inc(100)
    tokens.labels("b").inc(10)
    first = snapshot(endpoint(registry, at=10.0))
    tokens.labels("a").inc(50)
    tokens.labels("c").inc(7)  # new in the second scrape: no rate yet, as in Prometheus
    second = snapshot(endpoint(registry, at=12.5))
    rate = Rate(Selector("llm_generation_tokens_total"), ("model",)).evaluate(first, second)
    assert rate == {(("model", "a"),): 20.0, (("model", "b"),): 0.0}


def test_rate_after_a_counter_reset() -> None:
    before, after = CollectorRegistry(), CollectorRegistry()
    Counter("requests", "", registry=before).inc(500)
    Counter("requests", "", registry=after).inc(30)  # the process restarted
    rate = Rate(Selector("requests_total"), ()).evaluate(
        snapshot(endpoint(before, at=0.0)), snapshot(endpoint(after, at=3.0))
    )
    assert rate == {(): 10.0}


def test_rates_of_two_endpoints_use_each_endpoints_own_time() -> None:
    registry = CollectorRegistry()
    counter = Counter("work", "", registry=registry)
    first = snapshot(endpoint(registry, 0.0, "a:1"), endpoint(registry, 0.5, "b:1"))
    counter.inc(10)
    second = snapshot(endpoint(registry, 2.0, "a:1"), endpoint(registry, 5.5, "b:1"))
    rate = Rate(Selector("work_total"), ("instance",)).evaluate(first, second)
    assert rate == {(("instance", "a:1"),): 5.0, (("instance", "b:1"),): 2.0}


def test_gauge_aggregations() -> None:
    registry = CollectorRegistry()
    busy = Gauge("llm_gpu_busy_ratio", "", ["model", "device"], registry=registry)
    busy.labels("m", "cuda:0").set(0.2)
    busy.labels("m", "cuda:1").set(0.6)
    busy.labels("n", "cuda:2").set(0.9)
    snap = snapshot(endpoint(registry, 1.0))
    selector = Selector("llm_gpu_busy_ratio")
    m, n = (("model", "m"),), (("model", "n"),)
    assert GaugeExpr(selector, ("model",), "avg").evaluate(snap, snap) == {m: pytest.approx(0.4), n: 0.9}
    assert GaugeExpr(selector, ("model",), "max").evaluate(snap, snap) == {m: 0.6, n: 0.9}
    assert GaugeExpr(selector, ("model",), "min").evaluate(snap, snap) == {m: 0.2, n: 0.9}
    assert GaugeExpr(selector, (), "sum").evaluate(snap, snap) == {(): pytest.approx(1.7)}
    only_gpu1 = Selector("llm_gpu_busy_ratio", (eq("device", "cuda:1"),))
    assert GaugeExpr(only_gpu1, ("model",)).evaluate(snap, snap) == {m: 0.6}


def test_ratio_drops_groups_without_a_denominator() -> None:
    registry = CollectorRegistry()
    free = Gauge("free_bytes", "", ["gpu"], registry=registry)
    total = Gauge("total_bytes", "", ["gpu"], registry=registry)
    free.labels("0").set(25)
    total.labels("0").set(100)
    free.labels("1").set(5)
    total.labels("1").set(0)
    free.labels("2").set(5)  # no total at all
    snap = snapshot(endpoint(registry, 1.0))
    by = ("gpu",)
    ratio = Ratio(GaugeExpr(Selector("free_bytes"), by), GaugeExpr(Selector("total_bytes"), by))
    assert ratio.evaluate(snap, snap) == {(("gpu", "0"),): 0.25}


def test_quantile_and_mean_cover_only_the_window() -> None:
    registry = CollectorRegistry()
    itl = Histogram("itl_seconds", "", ["model"], buckets=(0.01, 0.1, 1.0), registry=registry)
    for _ in range(1000):
        itl.labels("m").observe(0.005)  # before the window: must not count
    first = snapshot(endpoint(registry, 0.0))
    for value in (0.2, 0.4, 0.6, 0.8):
        itl.labels("m").observe(value)
    second = snapshot(endpoint(registry, 1.0))
    group = (("model", "m"),)
    # All four new observations are in (0.1, 1.0]: the median interpolates to the middle of it.
    median = Quantile(0.5, Selector("itl_seconds"), ("model",))
    assert median.evaluate(first, second) == {group: pytest.approx(0.55)}
    assert histogram_mean(Selector("itl_seconds"), ("model",)).evaluate(first, second) == {
        group: pytest.approx(0.5)
    }
    # Against itself a snapshot has no window: no quantile.
    assert median.evaluate(second, second) == {}
