"""The clock that code deciding by elapsed time reads, so that a test can move it instead of waiting.

A rate limit, a budget or a time-out takes a :class:`Clock` (or, where it waits on an asyncio loop, a
:class:`LoopClock`), defaulting to :data:`SYSTEM_CLOCK`: ``time.monotonic`` and ``asyncio.sleep``. A test
passes a clock it moves by hand (``tests/support/clock.py``'s ``ManualClock``), so that what it checks
happens at the times it says, however busy the machine is.

Code on a hot path keeps the bound method (``self._now = clock.monotonic``): a call through it costs what
a call of ``time.monotonic`` costs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "LoopClock", "SystemClock"]


class Clock(Protocol):
    """Seconds on a clock that never goes back; only differences between two readings mean anything."""

    def monotonic(self) -> float: ...


class LoopClock(Clock, Protocol):
    """A :class:`Clock` that an asyncio task can also wait on."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: ``time.monotonic``, and ``asyncio.sleep`` on the running loop."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(asyncio.sleep)


#: What every clock parameter defaults to.
SYSTEM_CLOCK = SystemClock()
