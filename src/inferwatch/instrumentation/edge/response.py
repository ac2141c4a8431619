"""What the server sent for one request, as the middleware sees its response pass: the time to its first
content byte and to its last byte, whether the client left before the end, and a request the server
answered before any model ran for it.

The model's TTFT ends when its first token was sampled; the user sees the first byte that carries text, which
a streamer may hold back (``TextIteratorStreamer`` waits for a word boundary) and an event stream may precede
with events of no content (an OpenAI-style stream opens with the assistant's role). Both times are measured
from the request's :class:`~inferwatch.instrumentation.timing.arrival.Arrival`, beside TTFT and E2E
(``llm_response_time_to_first_content_seconds``, ``llm_response_time_to_last_byte_seconds``).

A request no model claimed that the server answered with a 4xx or 5xx (or an exception) is counted in
``llm_requests_total`` as ``rejected`` or ``server_error``, for the ``model`` the middleware was given,
else the one model instrumented in the process, else ``unknown``. Only POST requests count: an LLM
request is one, a scanner's ``GET /favicon.ico`` is not. This module does not import torch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.edge.received import received_at
from inferwatch.instrumentation.metrics.catalogue import ARRIVAL_SOURCES, existing_metrics, metrics_for
from inferwatch.instrumentation.timing.arrival import Arrival

#: How much of an event stream is kept while looking for its first event with content: a stream whose
#: first events hold more than this without any is taken to have content there.
_SCAN_LIMIT = 64 * 1024
#: The label of a refused request when the process has no one model it could be for.
UNKNOWN_MODEL = "unknown"

logger = logging.getLogger("inferwatch.instrumentation")


def _is_content(data: str) -> bool:
    """Whether one event's ``data`` carries generated output: a chat or completion chunk with text,
    reasoning or a tool call, a Responses API ``*.delta`` event, or any text that is not JSON."""
    data = data.strip()
    if not data or data == "[DONE]":
        return False
    try:
        event = json.loads(data)
    except ValueError:
        return True
    if not isinstance(event, dict):
        return True
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if choice.get("text") or (
            isinstance(delta, dict)
            and (delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
        ):
            return True
    kind = event.get("type")
    return isinstance(kind, str) and kind.endswith(".delta") and bool(event.get("delta"))


class ResponseWatch:
    """One response as it passes the middleware; ``sent`` after the server took each body chunk. Its first
    content is observed when it is sent (for the model whose request claimed the arrival), the rest by
    :class:`EdgeRecorder` when the exchange is over."""

    __slots__ = (
        "_scanned",
        "arrival",
        "completed",
        "event_stream",
        "first_content",
        "last_byte",
        "socket_wait",
        "status",
    )

    def __init__(self, arrival: Arrival) -> None:
        self.arrival = arrival
        #: Seconds from the kernel's receipt of the request to the middleware's call, where known.
        self.socket_wait: float | None = None
        self.status: int | None = None
        self.event_stream = False
        self.first_content: float | None = None
        self.last_byte: float | None = None
        self.completed = False  # its last body chunk was handed over
        self._scanned = b""

    def started(self, status: int, content_type: str) -> None:
        self.status = status
        self.event_stream = content_type.split(";", 1)[0].strip().lower() == "text/event-stream"

    def sent(self, body: bytes, more: bool, at: float) -> None:
        """The server took ``body`` at ``at``; ``more``: further chunks follow."""
        arrival = self.arrival
        if body:
            arrival.delivered(at)
            if self.first_content is None and self._carries_content(body):
                self.first_content = at
                series = arrival.series
                if series is not None:  # observed now, while the rest streams
                    series.observe_response(at - arrival.time, None, arrival.ttft_at_first_content)
        if not more:
            self.completed = True
            self.last_byte = at

    def _carries_content(self, body: bytes) -> bool:
        if not self.event_stream:
            return True
        scanned = self._scanned + body
        # Events end at a blank line; only complete ones are read (a chunk may end inside one).
        complete, separator, rest = scanned.replace(b"\r\n", b"\n").rpartition(b"\n\n")
        self._scanned = rest
        if len(rest) > _SCAN_LIMIT:
            return True
        if not separator:
            return False
        for event in complete.split(b"\n\n"):
            lines = event.decode("utf-8", "replace").split("\n")
            data = "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))
            if _is_content(data):
                self._scanned = b""
                return True
        return False

    def gone(self, at: float) -> None:
        """The client went away at ``at``: before the response was complete, its request is cancelled."""
        if not self.completed:
            self.arrival.disconnect(at)


class EdgeRecorder:
    """Turns finished responses into observations: the response times of a request a model claimed, the
    refusal of one no model ran for."""

    def __init__(self, model_name: str | None = None, registry: Any = None) -> None:
        self._model_name = model_name
        self._registry = registry
        #: ``llm_http_arrivals_total`` by source, bound once.
        self._arrivals: dict[str, Any] = {}

    def contained(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, or None if it raised: what it raises is counted (``stage="middleware"``) and
        logged, never passed to the server or the application."""
        try:
            return call(*args)
        except Exception as exc:
            self._report(exc)
            return None

    def _report(self, exc: Exception) -> None:
        metrics = existing_metrics(self._registry)
        if metrics is None:
            logger.warning("inferwatch: the middleware's response watch failed", exc_info=exc)
        else:
            metrics.errors.report("middleware", exc)

    def received(self, connection_of: Callable[[Any], Any], channel: Any, now: float) -> float | None:
        """When the kernel received the request on the connection ``connection_of(channel)`` finds
        (:mod:`.received`), on ``now``'s clock; None where unknown."""
        return self.contained(self._received, connection_of, channel, now)

    def _received(self, connection_of: Callable[[Any], Any], channel: Any, now: float) -> float | None:
        return received_at(connection_of(channel), now)

    def count_arrival(self, source: str) -> None:
        """A model's request claimed an arrival whose time came from ``source``. Other requests (a model
        list, a health check, a scanner) are no model's traffic and are not counted."""
        counter = self._arrivals.get(source)
        if counter is None:
            counter = self._arrivals[source] = self._metrics()[ARRIVAL_SOURCES].labels(source)
        counter.inc()

    def _metrics(self) -> Any:
        return existing_metrics(self._registry) or metrics_for(self._registry, InstrumentConfig.from_env())

    def record(self, watch: ResponseWatch, method: str, raised: bool) -> None:
        """The exchange is over (``raised``: the application raised instead of answering)."""
        series = watch.arrival.series
        if series is not None:
            if watch.socket_wait is not None:
                series.observe_socket_wait(watch.socket_wait)
            arrival = watch.arrival
            if watch.completed and arrival.disconnected_at is None:
                # A response with no content at all (an empty answer) reached its client whole at its end.
                ttft = arrival.ttft_at_first_content and watch.first_content is None
                series.observe_response(None, watch.last_byte - arrival.time, ttft)
            return
        if method != "POST":
            return
        status = 500 if raised or watch.status is None else watch.status
        if status >= 500:
            self._refusals()["server_error"].inc()
        elif status >= 400:
            self._refusals()["rejected"].inc()

    def _refusals(self) -> dict[str, Any]:
        """``llm_requests_total`` by status for the model a refused request is counted for."""
        from inferwatch.instrumentation.metrics.model_series import (
            series_for,  # imports torch: only once one is refused
        )

        metrics = self._metrics()
        name = self._model_name
        if name is None:
            alive = [model for model, count in metrics.live_models.items() if count > 0]
            name = alive[0] if len(alive) == 1 else UNKNOWN_MODEL
        return series_for(metrics, name).requests
