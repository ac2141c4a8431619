"""Arithmetic over series: values, coefficient of variation, alignment, least-squares fits."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def values(points: Sequence[tuple[float, float]]) -> list[float]:
    return [v for _, v in points]


def coefficient_of_variation(xs: Sequence[float]) -> float:
    mean = statistics.fmean(xs)
    return statistics.pstdev(xs) / mean if mean else math.inf


def aligned(*series: Sequence[tuple[float, float]]) -> list[tuple[float, ...]]:
    """Values of several series at the times all of them have a point (range queries share steps)."""
    by_time = [dict(points) for points in series]
    common = sorted(set.intersection(*(set(points) for points in by_time)))
    return [tuple(points[t] for points in by_time) for t in common]


def loglog_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares exponent k of y ~ x^k, and the R² of that fit in log-log space."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    syy = sum((b - my) ** 2 for b in ly)
    sxy = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return sxy / sxx, (sxy * sxy / (sxx * syy) if syy else 1.0)


def linear_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of value over time (per second)."""
    ts, vs = [t for t, _ in points], values(points)
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    denominator = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (v - mv) for t, v in zip(ts, vs, strict=True)) / denominator if denominator else 0.0
