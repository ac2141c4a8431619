"""The clock the exporter reads: monotonic time for deadlines, windows and durations, Unix time for
timestamps. :data:`SYSTEM_CLOCK` unless a test passes another, which lets it drive time instead of
sleeping (the GPM window, firmware turns, retry intervals, staleness)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back: for intervals and deadlines."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch: for timestamps."""
        ...


class SystemClock:
    """The host's clocks: ``time.monotonic()`` and ``time.time()``."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


SYSTEM_CLOCK: Clock = SystemClock()
