"""Leak (reference/002 §6.2): memory rising faster than the InferwatchMemoryLeak alert's rate (its
growth_bytes_above per lookback: 512 MiB an hour by default), step after step, while the token rate did
not rise by more than the alert's load_growth_ratio. Torch's allocated memory, the device memory in use
and the serving process's resident memory are judged alike."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from .. import checklist
from ..queries import GPU_MEMORY_USED, SERVING_INSTANCES, SERVING_RSS, TORCH_ALLOCATED, TOTAL_TOKENS_RATE
from ..units import percent, size
from .findings import Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import linear_slope, values
from .thresholds import Thresholds

# The alert reads the floors of 30-minute windows, so that one burst of allocations is not a trend; a
# diagnosis window can be a few steps, so instead most of its steps must rise.
LEAK_RISING_STEPS = 0.7


def _leak_in(points: Sequence[tuple[float, float]], bytes_per_second: float) -> float | None:
    """Relative growth over the window when memory rises steadily faster than ``bytes_per_second``."""
    if len(points) < 6 or points[0][1] <= 0:
        return None
    steps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(points)]
    rising = sum(1 for step in steps if step >= 0) / len(steps)
    slope = linear_slope(points)
    if slope <= bytes_per_second or rising < LEAK_RISING_STEPS:
        return None
    return slope * (points[-1][0] - points[0][0]) / points[0][1]


def _load_rose(points: Sequence[tuple[float, float]] | None, ratio: float) -> bool:
    if not points or len(points) < 3:
        return False
    third = max(1, len(points) // 3)
    early, late = statistics.fmean(values(points[:third])), statistics.fmean(values(points[-third:]))
    return late > early * (1 + ratio)


def check_leaks(source: Source, limits: Thresholds) -> list[Finding]:
    serving = set(source.series(SERVING_INSTANCES))
    rss = {g: p for g, p in source.series(SERVING_RSS).items() if g in serving}
    candidates = (
        (TORCH_ALLOCATED, source.series(TORCH_ALLOCATED), "torch allocated device memory"),
        (GPU_MEMORY_USED, source.series(GPU_MEMORY_USED), "device memory used"),
        (SERVING_RSS, rss, "serving process resident memory"),
    )
    if not any(series for _, series, _ in candidates):
        raise NotAssessed("no memory series (torch allocator, NVML, or serving process)")
    # The load of the whole fleet in view: device memory of a GPU serves whichever process runs on it.
    load = source.series(TOTAL_TOKENS_RATE).get(())
    findings = []
    for expr, series, what in candidates:
        for group, points in series.items():
            growth = _leak_in(points, limits.leak_bytes_per_second_above)
            if growth is None or _load_rose(load, limits.load_growth_ratio):
                continue
            per_minute = linear_slope(points) * 60
            findings.append(
                Finding(
                    "leak",
                    Severity.WARNING,
                    subject(group),
                    f"{what} grew {percent(growth)} over the window, step after step, faster than "
                    f"{size(limits.leak_bytes_per_second_above * 3600)}/h and without more load",
                    (
                        evidence_for(
                            source,
                            f"{what}: first / last point; trend",
                            f"{size(points[0][1])} / {size(points[-1][1])}; {size(per_minute)}/min",
                            expr,
                        ),
                        evidence_for(
                            source,
                            "generated tokens/s (first third -> last third of the window)",
                            _thirds(load),
                            TOTAL_TOKENS_RATE,
                        ),
                    ),
                    (checklist.LEAK,),
                )
            )
    return findings


def _thirds(points: Sequence[tuple[float, float]] | None) -> str:
    if not points or len(points) < 3:
        return "no data"
    third = max(1, len(points) // 3)
    return (
        f"{statistics.fmean(values(points[:third])):.1f} -> {statistics.fmean(values(points[-third:])):.1f}"
    )
