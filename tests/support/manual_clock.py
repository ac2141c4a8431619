"""A clock that moves only when a test says so, with the interface of the exporter's clock
(:class:`inferwatch.exporter.clock.Clock`): tests drive time instead of sleeping."""

from __future__ import annotations

import threading


class ManualClock:
    """Monotonic and Unix time that stand still until :meth:`advance`; both move together."""

    def __init__(self, unix: float = 1_750_000_000.0, monotonic: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._unix, self._monotonic = unix, monotonic

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def time(self) -> float:
        with self._lock:
            return self._unix

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._unix += seconds
            self._monotonic += seconds
