"""The catalogue's families collected at a cost that follows what changed, not how many series there are.

prometheus_client collects a labelled family by building a ``Sample`` (a name, a new dict of labels, a
value) for every series of every child, and its encoders format each one again: about 1 ms to collect and
1.5 ms (text) to 3 ms (OpenMetrics) to encode one instrumented model's 370 series on the development CPU,
so a process serving 64 models spent 60 ms collecting, 30 ms pickling for the endpoint's helper and 100-200
ms encoding per scrape (docs/benchmarks.md, "Issue 41"). :class:`CatalogueCollector` is the one collector
of the catalogue's families on a registry (they are not registered one by one): per child (one model's
series of one family) it keeps the lines of the exposition it last made, ``name{labels} value``, and the
values they were made of; a collection reads every child's values (plain reads, no sample objects) and
formats again only the children whose values moved. It yields
:class:`~inferwatch.common.prerendered.PrerenderedFamily` objects: the endpoint joins their lines into its
answers (:func:`~inferwatch.common.prerendered.encode_families`), and any other reader (prometheus_client's
``generate_latest``, ``get_sample_value``, the program's hub) gets their ``samples`` as before.

Neither path has ``_created`` series: inferwatch's families do not expose them, whatever
prometheus_client's global switch says for the process's other metrics (docs/metrics.md, "Series per
model").
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString
from prometheus_client.values import MutexValue

from inferwatch.common.prerendered import PrerenderedFamily


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _prefix(name: str, labels: dict[str, str]) -> str:
    """What prometheus_client's encoders write of a sample before its value (legacy names)."""
    if not labels:
        return f"{name} "
    pairs = ",".join(f'{key}="{_escaped(value)}"' for key, value in sorted(labels.items()))
    return f"{name}{{{pairs}}} "


@functools.lru_cache(maxsize=64)
def _bounds(upper_bounds: tuple[float, ...]) -> tuple[str, ...]:
    """A histogram's ``le`` values as the encoders write them (one layout per family)."""
    return tuple(floatToGoString(bound) for bound in upper_bounds)


def _known_prefixes(name: str, series: dict[str, str], child: Any, histogram: bool) -> list[str]:
    """:func:`_prefix` of every sample of a child with prometheus_client's own layout, made from its
    labels once (not from its samples: a histogram's ``le`` goes in at its sorted place)."""
    pairs = sorted(series.items())
    if not histogram:
        suffix = "_total" if type(child) is Counter else ""
        return [_prefix(name + suffix, series)]
    cut = bisect.bisect([key for key, _ in pairs], "le")
    head = "".join(f'{key}="{_escaped(value)}",' for key, value in pairs[:cut])
    tail = "".join(f',{key}="{_escaped(value)}"' for key, value in pairs[cut:])
    buckets = [f'{name}_bucket{{{head}le="{le}"{tail}}} ' for le in _bounds(tuple(child._upper_bounds))]
    return [*buckets, _prefix(f"{name}_count", series), _prefix(f"{name}_sum", series)]


_VALUE = operator.attrgetter("_value")


def _cells(child: Any) -> tuple[list[MutexValue], bool] | None:
    """The value cells of ``child`` in its samples' order, and whether they are a histogram's (buckets, not
    cumulative, then the sum), where it has prometheus_client's own layout in this process (not
    multiprocess mode's files, no sample method replaced on the instance); None otherwise."""
    if "_samples" in vars(child) or "_child_samples" in vars(child):
        return None
    kind = type(child)
    if kind in (Counter, Gauge) and type(child._value) is MutexValue:
        return [child._value], False
    if (
        kind is Histogram
        and child._upper_bounds[0] >= 0
        and all(type(b) is MutexValue for b in (*child._buckets, child._sum))
    ):
        return [*child._buckets, child._sum], True
    return None


class _Child:
    """One child's sample names and labels, the lines last made of it, the raw readings they were made of
    and the sample values they show."""

    __slots__ = ("_names", "cells", "child", "histogram", "lines", "prefixes", "raw", "series", "values")

    def __init__(self, family: MetricWrapperBase, label_values: tuple[str, ...], child: Any) -> None:
        self.child = child
        self.series = dict(zip(family._labelnames, label_values, strict=True))
        self._names: list[tuple[str, dict[str, str]]] | None = None
        known = _cells(child)
        if known is None:  # read, and named, through its samples
            self.cells, self.histogram = None, False
            self.prefixes = [_prefix(name, labels) for name, labels in self.names(family._name)]
        else:
            self.cells, self.histogram = known
            self.prefixes = _known_prefixes(family._name, self.series, child, self.histogram)
        self.raw: tuple[float, ...] | None = None
        self.values: tuple[float, ...] = ()
        self.lines = b""

    def names(self, name: str) -> list[tuple[str, dict[str, str]]]:
        """The child's samples' names and labels (made when first asked for: only readers of ``samples``
        need them)."""
        if self._names is None:
            samples = [s for s in self.child._samples() if s.name != "_created"]
            self._names = [(name + s.name, {**self.series, **s.labels}) for s in samples]
        return self._names

    def read(self) -> tuple[float, ...]:
        """The child's raw readings, through its samples (a child without the known layout)."""
        return tuple(s.value for s in self.child._samples() if s.name != "_created")

    def update(self, raw: tuple[float, ...]) -> None:
        """Format the child's lines again if ``raw``, its readings now, moved."""
        if raw == self.raw:
            return
        self.raw = raw
        if self.histogram:  # cumulative buckets, the count, the sum: the samples' values
            cumulative = list(itertools.accumulate(raw[:-1]))
            self.values = (*cumulative, cumulative[-1], raw[-1])
        else:
            self.values = raw
        self.lines = "".join(
            [
                f"{prefix}{floatToGoString(value)}\n"
                for prefix, value in zip(self.prefixes, self.values, strict=True)
            ]
        ).encode()


class _Family:
    """One catalogue family and its children's lines."""

    def __init__(self, family: MetricWrapperBase) -> None:
        self.family = family
        (described,) = family.describe()
        self.name, self.documentation = described.name, described.documentation
        self.type, self.unit = described.type, described.unit
        self.children: dict[tuple[str, ...], _Child] = {}
        self._current: dict[tuple[str, ...], Any] = {}  # the family's children when last collected
        # Every known-layout child's cells in one list, each child's span of it, the readings of the last
        # collection; the children read through their samples.
        self._cells: list[MutexValue] = []
        self._spans: list[tuple[_Child, int, int]] = []
        self._raw: tuple[float, ...] | None = None
        self._by_samples: list[_Child] = []
        self._last: tuple[bytes, list[tuple[_Child, tuple[float, ...]]]] | None = None

    def _children_changed(self, current: dict[tuple[str, ...], Any]) -> None:
        kept = self.children
        self.children = {
            key: kept[key] if key in kept and kept[key].child is child else _Child(self.family, key, child)
            for key, child in current.items()
        }
        self._current = current
        self._cells, self._spans, self._by_samples, self._raw, self._last = [], [], [], None, None
        for entry in self.children.values():
            if entry.cells is None:
                self._by_samples.append(entry)
            else:
                start = len(self._cells)
                self._cells.extend(entry.cells)
                self._spans.append((entry, start, len(self._cells)))

    def collect(self) -> PrerenderedFamily:
        family = self.family
        with family._lock:
            current = family._metrics.copy()
        if current != self._current:  # a child came or went (objects compare by identity)
            self._children_changed(current)
        # Every cell of the family read at once (a C-level map); the children looked at one by one only
        # when something in the family moved, and formatted again only where their part moved.
        raw = tuple(map(_VALUE, self._cells))
        if raw != self._raw or self._by_samples or self._last is None:
            for entry, start, end in self._spans:
                entry.update(raw[start:end])
            self._raw = raw
            for entry in self._by_samples:
                entry.update(entry.read())
            entries = list(self.children.values())
            self._last = (b"".join([entry.lines for entry in entries]), [(e, e.values) for e in entries])
        lines, shown = self._last  # nothing moved: the last collection's lines and values
        return PrerenderedFamily(
            self.name, self.documentation, self.type, self.unit, lines, lambda: _samples(family._name, shown)
        )

    def describe(self) -> Metric:
        return Metric(self.name, self.documentation, self.type, self.unit)


def _samples(name: str, shown: list[tuple[_Child, tuple[float, ...]]]) -> list[Sample]:
    return [
        Sample(sample, dict(labels), value)
        for entry, values in shown
        for (sample, labels), value in zip(entry.names(name), values, strict=True)
    ]


class CatalogueCollector:
    """The catalogue's families on one registry, collected as :class:`PrerenderedFamily` objects, in the
    catalogue's order; ``refresh`` runs first (the values that exist only when read: the oldest running
    request's age)."""

    def __init__(self, families: list[MetricWrapperBase], refresh: Callable[[], None]) -> None:
        self._families = [_Family(family) for family in families]
        self._refresh = refresh

    def describe(self) -> list[Metric]:
        return [family.describe() for family in self._families]

    def collect(self) -> Iterator[Metric]:
        self._refresh()
        return iter([family.collect() for family in self._families])
