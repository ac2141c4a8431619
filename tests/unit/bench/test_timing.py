"""Summary statistics of the benchmark."""

from __future__ import annotations

import statistics

import pytest

from inferwatch.bench.timing import DeviceClock, percentile, summarize


def test_percentile_interpolates_between_order_statistics() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    # rank (4 - 1) * 0.9 = 2.7: 70 % of the way from the third to the fourth value.
    assert percentile(values, 90) == pytest.approx(3.7)


def test_summarize_agrees_with_the_statistics_module() -> None:
    values = [0.010, 0.012, 0.011, 0.050, 0.013]
    summary = summarize(values)
    assert summary["count"] == 5
    assert summary["median"] == statistics.median(values)
    assert summary["mean"] == pytest.approx(statistics.fmean(values))
    assert (summary["min"], summary["max"]) == (0.010, 0.050)
    assert summary["median"] < summary["p90"] < summary["max"]


def test_summarize_of_nothing_is_json_safe() -> None:
    assert summarize([]) == {"count": 0, "median": None, "p90": None, "mean": None, "min": None, "max": None}


def test_device_clock_on_cpu_is_monotonic() -> None:
    clock = DeviceClock("cpu")
    first = clock.now()
    assert clock.now() >= first
