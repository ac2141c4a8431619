"""Leak: memory rising by more than 5 % over the window, step after step, while the load does not rise
(reference/002 §6.2)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from .. import checklist
from ..queries import GPU_MEMORY_USED, SERVING_INSTANCES, SERVING_RSS, TORCH_ALLOCATED, TOTAL_TOKENS_RATE
from ..units import percent, size
from .findings import Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import linear_slope, values

LEAK_GROWTH = 0.05
LEAK_RISING_STEPS = 0.7
LEAK_LOAD_GROWTH = 1.2


def _leak_in(points: Sequence[tuple[float, float]]) -> float | None:
    """Relative growth over the window when memory rises steadily, else None."""
    if len(points) < 6 or points[0][1] <= 0:
        return None
    steps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(points)]
    rising = sum(1 for step in steps if step >= 0) / len(steps)
    growth = linear_slope(points) * (points[-1][0] - points[0][0]) / points[0][1]
    return growth if growth > LEAK_GROWTH and rising >= LEAK_RISING_STEPS else None


def _load_rose(points: Sequence[tuple[float, float]] | None) -> bool:
    if not points or len(points) < 3:
        return False
    third = max(1, len(points) // 3)
    early, late = statistics.fmean(values(points[:third])), statistics.fmean(values(points[-third:]))
    return late > early * LEAK_LOAD_GROWTH


def check_leaks(source: Source) -> list[Finding]:
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
            growth = _leak_in(points)
            if growth is None or _load_rose(load):
                continue
            per_minute = linear_slope(points) * 60
            findings.append(
                Finding(
                    "leak",
                    Severity.WARNING,
                    subject(group),
                    f"{what} grew {percent(growth)} over the window, step after step, without more load",
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
