"""The PromQL shapes the monitor reads, which it can also evaluate on two scrapes.

``inferwatch top`` and ``inferwatch diagnose --endpoint`` have no Prometheus: they scrape endpoints
twice and compute rates and histogram quantiles from the differences. ``diagnose --prometheus`` asks a
server instead. Each expression here does both, so the two paths compute the same thing and every
figure a user is shown comes with the PromQL that reproduces it. The PromQL is written by
:mod:`inferwatch.common.promql`, the vocabulary the alerts and dashboards use too:

* :class:`Gauge` - ``sum by (job, instance, model) (llm_requests_running)``
* :class:`Rate` - ``sum by (job, instance, model) (rate(llm_generation_tokens_total[1m]))``
* :class:`Quantile` - ``histogram_quantile(0.99, sum by (job, instance, model, le) (rate(X_bucket[1m])))``
* :class:`Ratio` - one expression divided by another with the same grouping.

Evaluated locally, a rate is the counter's increase between the scrapes over the time between them
(a counter that went down was reset, and its new value is the increase, as in Prometheus); a quantile
interpolates linearly inside the bucket that holds the rank, exactly as ``histogram_quantile`` does.
A scrape carries no ``job`` label: a group leaves out the labels its samples do not have, as a PromQL
``by`` does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from inferwatch.common import promql
from inferwatch.common.promql import Selector
from inferwatch.monitor.scrape import Labels, Sample, Snapshot

Aggregation = Literal["sum", "avg", "max", "min"]
# Group labels -> value; groups without data are absent.
Vector = dict[Labels, float]


class Expr(Protocol):
    def query(self) -> promql.Expr:
        """The PromQL expression; its ranges take the rate window it is rendered with."""
        ...

    def promql(self, rate_window: str) -> str:
        """The PromQL expression as text; range selectors use ``rate_window`` (e.g. ``1m``)."""
        ...

    def evaluate(self, earlier: Snapshot, later: Snapshot) -> Vector:
        """The value of each group over the interval between two snapshots."""
        ...


def select(selector: Selector, snapshot: Snapshot) -> Iterable[Sample]:
    """The samples of ``snapshot`` that ``selector`` selects; a scrape is matched on equality only."""
    if any(matcher.op != "=" for matcher in selector.matchers):
        raise ValueError(f"{selector.render()}: only equality matchers can be evaluated on a scrape")
    wanted = {(matcher.name, matcher.value) for matcher in selector.matchers}
    return (s for s in snapshot.samples(selector.metric) if wanted <= set(s.labels))


def group_of(labels: Mapping[str, str], by: tuple[str, ...]) -> Labels:
    """The group of a series with ``labels`` when aggregated ``by``: the labels of ``by`` it has."""
    return tuple((name, labels[name]) for name in sorted(by) if name in labels)


def _group(sample: Sample, by: tuple[str, ...]) -> Labels:
    return group_of(dict(sample.labels), by)


class _Rendered:
    """``promql()`` of an expression shape: its :meth:`query`, pretty-printed."""

    def query(self) -> promql.Expr:
        raise NotImplementedError

    def promql(self, rate_window: str) -> str:
        return self.query().pretty(rate_window)


def _aggregate(values: dict[Labels, list[float]], how: Aggregation) -> Vector:
    reduce = {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v)}[how]
    return {group: reduce(found) for group, found in values.items() if found}


@dataclass(frozen=True)
class Gauge(_Rendered):
    """The current value of a gauge, aggregated by ``by``."""

    selector: Selector
    by: tuple[str, ...]
    aggregation: Aggregation = "sum"

    def query(self) -> promql.Expr:
        return promql.aggregate(self.aggregation, self.selector, self.by)

    def evaluate(self, earlier: Snapshot, later: Snapshot) -> Vector:
        grouped: defaultdict[Labels, list[float]] = defaultdict(list)
        for sample in select(self.selector, later):
            if not math.isnan(sample.value):
                grouped[_group(sample, self.by)].append(sample.value)
        return _aggregate(grouped, self.aggregation)


def _increases(
    selector: Selector, earlier: Snapshot, later: Snapshot
) -> Iterable[tuple[Sample, float, float]]:
    """(sample, increase, seconds) of every counter series present in both snapshots."""
    before = {s.labels: s for s in select(selector, earlier)}
    for sample in select(selector, later):
        previous = before.get(sample.labels)
        if previous is None:
            continue  # a series needs two samples for a rate, as in Prometheus
        increase = sample.value - previous.value if sample.value >= previous.value else sample.value
        yield sample, increase, later.time_of(sample) - earlier.time_of(previous)


@dataclass(frozen=True)
class Rate(_Rendered):
    """Per-second increase of a counter (``selector.metric`` ends in ``_total``), summed by ``by``."""

    selector: Selector
    by: tuple[str, ...]

    def query(self) -> promql.Expr:
        return promql.sum_rate(self.selector, self.by)

    def evaluate(self, earlier: Snapshot, later: Snapshot) -> Vector:
        grouped: defaultdict[Labels, list[float]] = defaultdict(list)
        for sample, increase, seconds in _increases(self.selector, earlier, later):
            if seconds > 0:
                grouped[_group(sample, self.by)].append(increase / seconds)
        return _aggregate(grouped, "sum")


def bucket_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` (promql/quantile.go) on cumulative bucket counts (upper
    bound -> count), for 0 <= q <= 1.

    The rank ``q * total`` falls in the first bucket whose cumulative count reaches it; the result is
    interpolated linearly between that bucket's bounds (the first bucket starts at 0). A rank in the +Inf
    bucket gives the highest finite bound. None where Prometheus gives NaN: nothing observed, or no
    +Inf bucket.
    """
    if math.inf not in buckets or len(buckets) < 2:
        return None
    bounds = sorted(buckets)
    # A scrape between two bucket updates can break the cumulative order slightly; Prometheus repairs it
    # by carrying the maximum forward.
    counts, running = [], 0.0
    for bound in bounds:
        running = max(running, buckets[bound])
        counts.append(running)
    if counts[-1] == 0:
        return None
    rank = q * counts[-1]
    index = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start, in_bucket = 0.0, counts[index]
    if index > 0:
        start = bounds[index - 1]
        in_bucket -= counts[index - 1]
        rank -= counts[index - 1]
    if in_bucket == 0:  # only for q == 0 with an empty first bucket: NaN in Prometheus
        return None
    return start + (bounds[index] - start) * rank / in_bucket


@dataclass(frozen=True)
class Quantile(_Rendered):
    """The ``q`` quantile of a histogram's observations over the window, by ``by``."""

    q: float
    selector: Selector  # the histogram's base name, without _bucket
    by: tuple[str, ...]

    def query(self) -> promql.Expr:
        return promql.histogram_quantile(self.q, self.selector, self.by)

    def evaluate(self, earlier: Snapshot, later: Snapshot) -> Vector:
        grouped: defaultdict[Labels, defaultdict[float, float]] = defaultdict(lambda: defaultdict(float))
        for sample, increase, _ in _increases(self.selector.suffixed("_bucket"), earlier, later):
            grouped[_group(sample, self.by)][float(sample.label("le"))] += increase
        out = {}
        for group, buckets in grouped.items():
            value = bucket_quantile(self.q, buckets)
            if value is not None:
                out[group] = value
        return out


@dataclass(frozen=True)
class Ratio(_Rendered):
    """``numerator / denominator``, both grouped by the same labels; groups with a zero (or missing)
    denominator have no value, as PromQL's division gives NaN or nothing there."""

    numerator: Expr
    denominator: Expr

    def query(self) -> promql.Expr:
        return self.numerator.query() / self.denominator.query()

    def evaluate(self, earlier: Snapshot, later: Snapshot) -> Vector:
        numerator = self.numerator.evaluate(earlier, later)
        denominator = self.denominator.evaluate(earlier, later)
        return {
            group: value / denominator[group]
            for group, value in numerator.items()
            if denominator.get(group, 0.0) != 0.0
        }


def histogram_mean(selector: Selector, by: tuple[str, ...]) -> Ratio:
    """Mean observation over the window: rate of ``_sum`` over rate of ``_count``."""
    return Ratio(Rate(selector.suffixed("_sum"), by), Rate(selector.suffixed("_count"), by))
