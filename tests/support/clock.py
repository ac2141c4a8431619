"""A clock the test moves (an :class:`inferwatch.common.clock.LoopClock`), for code that decides by elapsed
time: a rate limit's window passes, a budget refills, a GPM window closes, a collection ages when the test
says so, not when a busy machine gets round to it."""

from __future__ import annotations

import asyncio
import threading


class ManualClock:
    """Monotonic and Unix time that stand still until :meth:`advance`, and move together. A task in
    :meth:`sleep` wakes once the clock has been moved past the end of its sleep, and only then, as on a
    machine where nothing else takes any time. Readable from any thread."""

    def __init__(self, start: float = 1000.0, unix: float = 1_750_000_000.0) -> None:
        self._lock = threading.Lock()
        self.now = start  # not 0: code must not take a reading of 0 for "never"
        self._unix_offset = unix - start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        with self._lock:
            return self.now

    def time(self) -> float:
        with self._lock:
            return self.now + self._unix_offset

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, waking the sleeps that end by then (call it on their loop)."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back: advance({seconds})")
        with self._lock:
            self.now += seconds
        for ends, woken in self._sleepers:
            if ends <= self.now and not woken.done():
                woken.set_result(None)
        self._sleepers = [(ends, woken) for ends, woken in self._sleepers if not woken.done()]

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, woken))
        await woken

    async def advance_until_done(self, task: asyncio.Future[object], step: float) -> float:
        """Move the clock ``step`` at a time, letting the loop run in between, until ``task`` is done;
        the seconds it took."""
        started = self.now
        await asyncio.sleep(0)  # the task runs up to its first wait
        while not task.done():
            self.advance(step)
            await asyncio.sleep(0)
        return self.now - started
