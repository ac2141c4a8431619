"""Counters that never go down, although the hardware counters they come from do.

NVML's cumulative values (energy, throttle time, ECC and PCIe replay counts) restart from zero when the
driver reloads or the GPU resets, and volatile ECC counts clear on every driver load. Exporting them raw
makes ``rate()`` see a reset it can mostly absorb, but ``increase()`` over a window that spans the reset,
dashboards showing the raw value and alerts on ``changes()`` all go wrong, and a counter that goes down is
one of the complaints this exporter answers. So each raw value passes through :class:`MonotonicCounters`:
when it drops, the last value seen before the drop becomes an offset that is added from then on.
"""

from __future__ import annotations

from collections.abc import Hashable


class MonotonicCounters:
    """Reset-safe running totals, one per key (metric and labels).

    Not thread-safe: one poller thread owns it. Keys must come from a bounded set (GPU series only):
    an entry lives as long as the exporter, so that a GPU that drops out and returns keeps its offset.
    """

    def __init__(self) -> None:
        self._state: dict[Hashable, tuple[float, float]] = {}  # key -> (last raw value, offset)

    def adjust(self, key: Hashable, raw: float) -> float:
        """The exported value for ``raw``: never less than any value returned before for ``key``."""
        last_raw, offset = self._state.get(key, (0.0, 0.0))
        if raw < last_raw:
            offset += last_raw
        self._state[key] = (raw, offset)
        return raw + offset
