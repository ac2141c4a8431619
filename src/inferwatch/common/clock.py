"""The clock that code deciding by elapsed time reads, so that a test can move it instead of waiting.

A rate limit, a budget, a time-out, a poll window or a timestamp takes a :class:`Clock` (or, where it
waits on an asyncio loop, a :class:`LoopClock`), defaulting to :data:`SYSTEM_CLOCK`: ``time.monotonic``,
``time.time`` and ``asyncio.sleep``. A test passes a clock it moves by hand (``tests/support/clock.py``'s
``ManualClock``), so that what it checks happens at the times it says, however busy the machine is.

Code on a hot path keeps the bound method (``self._now = clock.monotonic``): a call through it costs what
a call of ``time.monotonic`` costs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "LoopClock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back: for intervals and deadlines."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch: for timestamps."""
        ...


class LoopClock(Clock, Protocol):
    """A :class:`Clock` that an asyncio task can also wait on."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clocks: ``time.monotonic``, ``time.time``, and ``asyncio.sleep`` on the running loop."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)
    sleep = staticmethod(asyncio.sleep)


#: What every clock parameter defaults to.
SYSTEM_CLOCK = SystemClock()
