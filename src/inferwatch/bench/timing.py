"""Synchronized wall-clock timing and the summary statistics the benchmark reports.

GPU kernels run asynchronously: a host clock read right after a launch measures the launch, not the work
(reference/000 shows ``time.time()`` reading 2.3 ms for a 12.6 ms forward). A benchmark may pay for
correctness with synchronization, so :class:`DeviceClock` waits for the device before every reading. The
serving path never does this; it is the ground truth that inferwatch's own metrics are checked against.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any


class DeviceClock:
    """``time.perf_counter`` read after the device has finished all queued work."""

    def __init__(self, device: Any) -> None:
        import torch

        self._device = torch.device(device)
        if self._device.type == "cuda":
            self._synchronize = lambda: torch.cuda.synchronize(self._device)
        elif self._device.type == "mps":
            self._synchronize = torch.mps.synchronize
        else:
            # CPU kernels complete before the call returns: there is nothing to wait for.
            self._synchronize = lambda: None

    def now(self) -> float:
        """Seconds on the monotonic performance counter, after the device is idle."""
        self._synchronize()
        return time.perf_counter()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics (NumPy's
    default), so that small samples still give a meaningful tail figure."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float | None]:
    """Count, median, p90, mean, min and max of a sample. An empty sample (a request of one token has
    no inter-token interval) gives ``None`` statistics, which JSON can carry and NaN cannot."""
    if not values:
        return {"count": 0, "median": None, "p90": None, "mean": None, "min": None, "max": None}
    return {
        "count": len(values),
        "median": statistics.median(values),
        "p90": percentile(values, 90),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }
