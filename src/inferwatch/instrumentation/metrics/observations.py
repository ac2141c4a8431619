"""Histogram observations in batches: a run of values as one update per bucket touched, and a drain's
observations gathered and applied together (:class:`Observations`)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferwatch.instrumentation.metrics.model_series import ModelSeries
    from inferwatch.instrumentation.metrics.vocabulary import ForwardPhase


def _bucket_layout(histogram: Any) -> tuple[list[float], list[Any], Any] | None:
    """A histogram child's bounds (ascending, ending in +Inf), bucket counters and sum counter, where it
    has prometheus_client's layout and its own ``observe`` (not one replaced on the instance: a wrapper
    that records the values, say); None where values must go through ``observe`` one by one."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    replaced = "observe" in getattr(histogram, "__dict__", ())
    if replaced or bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        return None
    return bounds, buckets, total


def observe_many(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(value)`` for every value, as one update per bucket touched.

    prometheus_client's ``observe`` takes a lock for the sum and another for the value's bucket, found by
    a scan in Python: per value that is the largest part of resolving a step (docs/benchmarks.md, "Overhead
    on the fastest decode paths"). Here the buckets are counted first: the bucket of ``v`` is the first
    bound >= ``v``, as ``observe`` has it, so a bucket holds the values above the bound before it, up to its
    own. The values of a batch (a run's steps) mostly fall in one or two buckets: sorted, they are counted
    by one ``bisect`` per bucket they span, not one Python step per value."""
    layout = _bucket_layout(histogram)
    if layout is None:
        for value in values:
            histogram.observe(value)
        return
    bounds, buckets, total = layout
    value_sum = sum(values)
    # A NaN lands in no bucket, only in the sum (as with observe), and does not sort: counted out.
    ordered = sorted(values if value_sum == value_sum else [v for v in values if v == v])
    if ordered:
        index, last = bisect.bisect_left(bounds, ordered[0]), bisect.bisect_left(bounds, ordered[-1])
        below = 0  # values under the current bucket
        while index < last:
            upto = bisect.bisect_right(ordered, bounds[index])
            if upto > below:
                buckets[index].inc(upto - below)
                below = upto
            index += 1
        buckets[last].inc(len(ordered) - below)
    total.inc(value_sum)


def observe_repeated(histogram: Any, value: float, count: int) -> None:
    """``histogram.observe(value)`` ``count`` times, as one update of its bucket and one of its sum: the
    batch size and tokens of every step of a compiled decode run are the same."""
    layout = _bucket_layout(histogram)
    if layout is None:
        for _ in range(count):
            histogram.observe(value)
        return
    bounds, buckets, total = layout
    if value == value:
        buckets[bisect.bisect_left(bounds, value)].inc(count)
    total.inc(value * count)


class Observations:
    """What resolving a batch of steps observes, gathered and made together by :meth:`flush`: the values
    of each histogram child go through :func:`observe_many`, forwards through one locked update per
    (model, device, phase)."""

    __slots__ = ("_counts", "_forwards", "_repeated", "_values")

    def __init__(self) -> None:
        self._values: dict[Any, list[float]] = {}
        self._repeated: dict[tuple[Any, float], int] = {}
        self._forwards: dict[tuple[ModelSeries, str, str], list[Any]] = {}  # [durations, bytes, flops]
        self._counts: dict[Any, float] = {}

    def count(self, counter: Any, amount: float) -> None:
        """``counter.inc(amount)``, made once per counter with the batch's total."""
        self._counts[counter] = self._counts.get(counter, 0.0) + amount

    def observe(self, histogram: Any, value: float) -> None:
        values = self._values.get(histogram)
        if values is None:
            values = self._values[histogram] = []
        values.append(value)

    def observe_all(self, histogram: Any, values: list[float]) -> None:
        gathered = self._values.get(histogram)
        if gathered is None:
            self._values[histogram] = values
        else:
            gathered.extend(values)

    def observe_repeated(self, histogram: Any, value: float, count: int) -> None:
        """``value`` observed ``count`` times (see :func:`observe_repeated`)."""
        key = (histogram, value)
        self._repeated[key] = self._repeated.get(key, 0) + count

    def forward(
        self,
        series: ModelSeries,
        device: str,
        phase: ForwardPhase,
        seconds: float,
        read_bytes: float,
        flops: float,
    ) -> None:
        """A resolved forward (see :meth:`ModelSeries.add_forwards`)."""
        self.forwards(series, device, phase, [seconds], read_bytes, flops)

    def forwards(
        self,
        series: ModelSeries,
        device: str,
        phase: ForwardPhase,
        durations: list[float],
        read_bytes: float = 0.0,
        flops: float = 0.0,
    ) -> None:
        """Resolved forwards of one phase; ``read_bytes`` and ``flops`` are their totals."""
        entry = self._forwards.get((series, device, phase))
        if entry is None:
            self._forwards[(series, device, phase)] = [list(durations), read_bytes, flops]
        else:
            entry[0].extend(durations)
            entry[1] += read_bytes
            entry[2] += flops

    def step_tokens(self, series: ModelSeries, prefill: int, decode: int) -> None:
        """Tokens of one forward by kind (a kind the step did not carry is not observed)."""
        if prefill:
            self.observe(series.step_tokens["prefill"], prefill)
        if decode:
            self.observe(series.step_tokens["decode"], decode)

    def flush(self) -> None:
        """Make every gathered observation; the batch starts empty again even if one fails."""
        values, self._values = self._values, {}
        repeated, self._repeated = self._repeated, {}
        forwards, self._forwards = self._forwards, {}
        counts, self._counts = self._counts, {}
        for counter, amount in counts.items():
            if amount:
                counter.inc(amount)
        for (series, device, phase), (durations, read_bytes, flops) in forwards.items():
            series.add_forwards(device, phase, durations, read_bytes, flops)
        for histogram, batch in values.items():
            observe_many(histogram, batch)
        for (histogram, value), count in repeated.items():
            observe_repeated(histogram, value, count)
