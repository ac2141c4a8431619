"""Background threads: finish deferred observations and poll what is too slow for the hot path.

A :class:`Worker` is a daemon thread with two jobs:

* *pending items* (requests or forwards whose CUDA events had not completed when the serving thread
  last looked): re-checked every :data:`RESOLVE_PERIOD_SECONDS` with non-blocking queries;
* *pollers* (allocator memory, KV headroom, busy ratio, NVML): each called every ``interval`` seconds.
  Pollers are reference-counted by key, so two models on one device share one device poller.

The thread starts on demand and exits when it has nothing left to do. NVML gets its own worker, so a
hung NVML call can only make NVML readings stale. After ``fork()`` the child starts its own threads.

The process has one thread of each kind, but nothing on the request path reaches them directly: each
instrumented model is given a :class:`Lane` of the background worker (``ModelContext.background``), and
its hooks and requests hand their pending items to that lane, so ``handle.flush()`` waits for its own
model's items only. One lock, the worker's condition, guards the pending items, every lane's count and the
pollers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from inferwatch.instrumentation.metrics.containment import ErrorReporter, logger

RESOLVE_PERIOD_SECONDS = 0.002


class PendingItem(Protocol):
    """Observations waiting for the device: requests, forwards, a continuous-batching timeline."""

    def resolve(self) -> bool:
        """Make the observations whose marks are complete; True once nothing is left."""
        ...

    def expired(self) -> bool: ...


class Poller(Protocol):
    interval: float

    def poll(self) -> None: ...


# A poller may also have ``close()``: what polling holds (NVML's sample buffers) goes back there, called
# once on the worker's thread after the poller's last poll.


class _Registration:
    __slots__ = ("due", "poller", "refs")

    def __init__(self, poller: Poller) -> None:
        self.poller = poller
        self.refs = 0
        self.due = time.monotonic()


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's pending items are the parent's to resolve: their lanes start empty.
        for _, _, lane in getattr(self, "_pending", ()):
            lane.pending = 0
        self._cond = threading.Condition()
        self._pending: list[tuple[PendingItem, ErrorReporter, Lane]] = []
        self._pollers: dict[Hashable, _Registration] = {}
        self._released: list[Poller] = []  # to close on the thread, never during one of their polls
        self._thread: threading.Thread | None = None

    # -- API -------------------------------------------------------------------------------------------

    def acquire(self, key: Hashable, factory: Callable[[], Poller]) -> Poller:
        """Poll ``factory()`` (created once per key) until a matching :meth:`release`; the poller."""
        with self._cond:
            registration = self._pollers.get(key)
            if registration is None:
                registration = self._pollers[key] = _Registration(factory())
            registration.refs += 1
            self._ensure_thread()
            self._cond.notify_all()
            return registration.poller

    def release(self, key: Hashable) -> None:
        with self._cond:
            registration = self._pollers.get(key)
            if registration is not None:
                registration.refs -= 1
                if registration.refs <= 0:
                    del self._pollers[key]
                    self._released.append(registration.poller)
                    self._ensure_thread()
                    self._cond.notify_all()

    def lane(self) -> Lane:
        """A new lane of this worker: the pending items of one model (or of tracked requests)."""
        return Lane(self)

    def _defer(self, item: PendingItem, errors: ErrorReporter, lane: Lane) -> None:
        with self._cond:
            self._pending.append((item, errors, lane))
            lane.pending += 1
            self._ensure_thread()
            self._cond.notify_all()

    def _flush(self, lane: Lane, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while lane.pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, RESOLVE_PERIOD_SECONDS * 5))
            return True

    # -- the thread ------------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                released, self._released = self._released, []
            for poller in released:
                self._close(poller)
            with self._cond:
                if not self._pending and not self._pollers and not self._released:
                    self._thread = None
                    return
                now = time.monotonic()
                next_due = min((r.due for r in self._pollers.values()), default=now + 3600.0)
                wait = next_due - now
                if self._pending:
                    wait = min(wait, RESOLVE_PERIOD_SECONDS)
                if wait > 0:
                    self._cond.wait(wait)
                pending = list(self._pending)
                due = [r for r in self._pollers.values() if r.due <= time.monotonic()]
            if pending:
                done = [entry for entry in pending if self._settle(entry[0], entry[1])]
                with self._cond:
                    for entry in done:
                        self._pending.remove(entry)
                        entry[2].pending -= 1
                    self._cond.notify_all()
            for registration in due:
                registration.due = time.monotonic() + registration.poller.interval
                try:
                    registration.poller.poll()
                except Exception:
                    # Pollers count their own errors; this is the backstop that keeps the thread alive.
                    logger.exception("inferwatch: poller %r failed", registration.poller)

    @staticmethod
    def _close(poller: Poller) -> None:
        close = getattr(poller, "close", None)
        try:
            if close is not None:
                close()
        except Exception:
            logger.exception("inferwatch: closing poller %r failed", poller)

    @staticmethod
    def _settle(item: PendingItem, errors: ErrorReporter) -> bool:
        try:
            if item.resolve():
                return True
            if item.expired():
                errors.report("resolve", TimeoutError(f"device marks of {item!r} never completed; dropped"))
                return True
            return False
        except Exception as exc:
            errors.report("resolve", exc)
            return True


class Lane:
    """One model's share of a :class:`Worker`'s pending items: what it defers, and a flush that waits for
    those alone. Its count is guarded by the worker's lock."""

    __slots__ = ("pending", "worker")

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pending = 0

    def defer(self, item: PendingItem, errors: ErrorReporter) -> None:
        """Call ``item.resolve()`` on the worker until it returns True or the item expires (counted as an
        error)."""
        self.worker._defer(item, errors, self)

    def resolve_or_defer(self, item: PendingItem, errors: ErrorReporter) -> None:
        """``item.resolve()`` now, in the caller's thread; what is left, on the worker."""
        if not item.resolve():
            self.worker._defer(item, errors, self)

    def flush(self, timeout: float) -> bool:
        """Wait until none of this lane's items is pending; False if some still are after ``timeout``."""
        return self.worker._flush(self, timeout)


#: Resolves deferred observations and polls torch state (allocator, headroom, utilization windows).
BACKGROUND = Worker("inferwatch-background")
#: Polls NVML, apart from everything else because a driver call can hang.
NVML_WORKER = Worker("inferwatch-nvml")
