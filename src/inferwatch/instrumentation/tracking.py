"""Request tracking for hand-written decode loops, feeding the same metrics as ``generate``::

    with track_request(model_name="my-model", prompt_tokens=len(prompt), device="cuda:0") as req:
        logits, cache = model(prompt_ids)          # prefill
        for _ in range(max_new_tokens):
            token = sample(logits)
            req.token()                             # one token per sequence is ready (first call: TTFT)
            logits, cache = model(token, cache)

On CUDA, ``req.token()`` records an event on the current stream, so the token counts as produced when the
device reaches that point, not when the host queued the work. Forward passes of an instrumented model
inside the block are attributed to the request (forward time, KV cache) when ``device`` matches it.
Leaving the block records the outcome: ok, or error / oom when an exception escapes (it is re-raised).
"""

from __future__ import annotations

import math
from types import TracebackType

import torch
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.device.hardware import device_label
from inferwatch.instrumentation.device.worker import BACKGROUND
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from inferwatch.instrumentation.metrics.vocabulary import STATUSES, Status
from inferwatch.instrumentation.timing.arrival import ARRIVAL
from inferwatch.instrumentation.timing.clock import Known, clock_for
from inferwatch.instrumentation.timing.request import CURRENT_REQUEST, Request, failure_status
from inferwatch.instrumentation.timing.tokens import LiveTokens

#: The background lane of every tracked request: what a tracked request's marks left unresolved at its
#: end, they resolve there.
TRACKED_REQUESTS = BACKGROUND.lane()


class RequestTracker:
    """One tracked request; use it as a context manager (see :func:`track_request`)."""

    def __init__(
        self,
        model_name: str,
        prompt_tokens: int,
        device: torch.device | str | None,
        registry: CollectorRegistry | None,
        config: InstrumentConfig | None,
        arrival: float | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if not isinstance(model_name, str) or not model_name.strip():
            raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an int >= 0, got {prompt_tokens!r}")
        metrics = metrics_for(registry, config or InstrumentConfig())
        self._series = series_for(metrics, model_name)
        self._errors = metrics.errors
        self._clock = clock_for(device)
        self._device_label = device_label(self._clock.device)
        self._prompt_tokens = prompt_tokens
        self._arrival = arrival
        self._max_new_tokens = max_new_tokens
        self._request: Request | None = None
        self._context_token = None
        self._finished = False

    def __enter__(self) -> RequestTracker:
        try:
            live = LiveTokens(Known([self._prompt_tokens]), 1, math.inf)
            request = Request(
                self._series,
                self._clock,
                background=TRACKED_REQUESTS,
                live=live,
                arrival=self._arrival,
                token_limit=self._max_new_tokens,
            )
            self._request = request
            open_arrival = ARRIVAL.get()
            if open_arrival is not None:
                claimed = open_arrival.claim(self._series, request.cancel)
                if self._arrival is None:
                    request.arrived(claimed, open_arrival.ttft_at_first_content)
            self._context_token = CURRENT_REQUEST.set(self._request)
        except Exception as exc:
            self._errors.report("track", exc)
        return self

    def token(self, k: int = 1) -> None:
        """``k`` tokens per sequence became available (k > 1: speculative or multi-token steps)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        request = self._request
        if request is None or self._finished:
            return
        try:
            self._series.heartbeat()
            request.mark_tokens(self._device_label, k)
            request.drain_batch()
        except Exception as exc:
            self._errors.report("track", exc)

    def finish(self, status: Status = "ok") -> None:
        """End the request now with ``status`` (see ``llm_requests_total``: ok, error, oom, cancelled,
        rejected, server_error); leaving the block does it otherwise."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        request = self._request
        if request is None or self._finished:
            return
        self._finished = True
        try:
            request.finish(status)
        except Exception as exc:
            self._errors.report("track", exc)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._context_token is not None:
            CURRENT_REQUEST.reset(self._context_token)
            self._context_token = None
        if exc is None:
            self.finish("ok")
        else:
            self.finish(failure_status(exc))


def track_request(
    model_name: str,
    *,
    prompt_tokens: int = 0,
    device: torch.device | str | None = None,
    registry: CollectorRegistry | None = None,
    config: InstrumentConfig | None = None,
    arrival: float | None = None,
    max_new_tokens: int | None = None,
) -> RequestTracker:
    """Track one request of a hand-written decode loop; see the module documentation.

    ``arrival``: ``time.perf_counter()`` when the request reached the server (default: the arrival
    opened by the middleware or :func:`~inferwatch.instrumentation.timing.arrival.request_arrival`, if any);
    TTFT and end-to-end latency are then measured from it and its queue time observed.
    ``max_new_tokens``: the token steps the loop may run, where it has a limit: a request that ran them
    all finished for ``length`` (``llm_requests_finished_total``), else for ``stop``.
    ``device``: where the tokens are computed (``"cuda:0"``: token times from CUDA events; None or
    ``"cpu"``: host clock). ``registry``/``config`` as for :func:`~inferwatch.instrumentation.instrument`.
    """
    return RequestTracker(model_name, prompt_tokens, device, registry, config, arrival, max_new_tokens)
