"""Log lines rate limited per kind of event, so that a flood of events cannot flood the log.

A kind of event is a log call's message template (``record.msg`` before its arguments are filled in):
``"GPU %d (%s): XID %d"`` is one kind whatever the GPU and code. Each kind may log ``burst`` lines per
``window`` seconds; the lines beyond are dropped and counted, and the next line of that kind that gets
through says how many were dropped. The counts the events feed (metrics) are never rate limited: only
what is written to the log.

Attach it to the loggers whose events can come in floods (XID events, HTTP clients, collection
overruns); a filter on a logger applies to the records logged on that very logger::

    log = logging.getLogger(__name__)
    log.addFilter(RateLimit())
"""

from __future__ import annotations

import logging
import threading

from inferwatch.common.clock import SYSTEM_CLOCK, Clock

#: Lines of one kind of event per window: enough to see what happens, too few to fill a disk.
DEFAULT_BURST = 5
DEFAULT_WINDOW_SECONDS = 60.0
# Kinds remembered before those whose window has passed are forgotten: templates are few, but a caller
# that formats its message itself makes every line a kind of its own.
_KINDS_KEPT = 256


class RateLimit(logging.Filter):
    """A ``logging.Filter`` letting through at most ``burst`` records per message template per ``window``
    seconds of ``clock``."""

    def __init__(
        self, burst: int = DEFAULT_BURST, window: float = DEFAULT_WINDOW_SECONDS, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        super().__init__()
        if burst < 1 or window <= 0:
            raise ValueError(f"a rate limit needs burst >= 1 and window > 0, got {burst} and {window}")
        self._burst = burst
        self._window = window
        self._now = clock.monotonic
        self._lock = threading.Lock()
        # template -> (window start, lines let through in it, lines dropped since the last one let through)
        self._kinds: dict[object, tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._now()
        key = record.msg
        with self._lock:
            started, passed, dropped = self._kinds.get(key, (now, 0, 0))
            if now - started >= self._window:
                started, passed = now, 0
            if passed >= self._burst:
                self._kinds[key] = (started, passed, dropped + 1)
                return False
            self._kinds[key] = (started, passed + 1, 0)
            if len(self._kinds) > _KINDS_KEPT:
                self._forget_old(now)
        if dropped:
            record.msg = f"{record.msg} (and {dropped} more like this not logged)"
        return True

    def _forget_old(self, now: float) -> None:
        """Drop the kinds whose window has passed with nothing dropped (nothing left to report)."""
        for key, (started, _, dropped) in list(self._kinds.items()):
            if now - started >= self._window and not dropped:
                del self._kinds[key]
