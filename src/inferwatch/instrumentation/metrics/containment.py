"""Containment of inferwatch's own failures: counted, logged at a bounded rate, never raised.

Every hook body and background task runs under ``try/except Exception`` and hands what it caught to
:meth:`ErrorReporter.report`; the model's own exceptions never pass through here (they are re-raised
unchanged by the wrappers).
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import Counter

logger = logging.getLogger("inferwatch.instrumentation")

# The stages an error can be counted under (the `stage` label of llm_instrumentation_errors_total).
STAGES = (
    "instrument",  # setting up or removing hooks
    "forward_pre",  # the forward pre-hook
    "forward_post",  # the forward post-hook (timing marks, KV-cache shapes)
    "generate_enter",  # starting a request in the generate wrapper
    "generate_exit",  # finishing a request (token counts, end-to-end latency)
    "token_mark",  # the sampled-token mark (a stopping criterion added to generate)
    "speculative",  # assisted generation's rounds (draft and accepted tokens)
    "track",  # the request-tracking API
    "batching",  # continuous batching's hooks (requests, steps, deliveries)
    "middleware",  # the ASGI/WSGI middleware's response watch and refusals
    "resolve",  # turning device events into observations
    "sample",  # the background sampler (allocator memory, headroom, busy ratio)
    "nvml",  # NVML readings
    "collect",  # forgetting a model that was garbage-collected
)


class ErrorReporter:
    """Counts errors by stage and logs each stage at most once per ``log_interval`` seconds."""

    def __init__(self, counter: Counter, log_interval: float) -> None:
        self._counter = counter
        self._log_interval = log_interval
        self._last_logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def report(self, stage: str, exc: BaseException) -> None:
        """Count and maybe log ``exc``; never raises."""
        try:
            self._counter.labels(stage).inc()
            now = time.monotonic()
            with self._lock:
                last = self._last_logged.get(stage)
                if last is not None and now - last < self._log_interval:
                    self._suppressed[stage] = self._suppressed.get(stage, 0) + 1
                    return
                self._last_logged[stage] = now
                suppressed = self._suppressed.pop(stage, 0)
            logger.warning(
                "inferwatch internal error in %s (contained; counted in llm_instrumentation_errors_total; "
                "%d similar errors not logged since the last report)",
                stage,
                suppressed,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        except Exception:  # the reporter is the last line of defence: it must not raise either
            pass
