"""When a request reached the server: the start of the time its user waits.

A server knows a request's arrival long before ``generate`` runs: it may wait in a queue (``transformers
serve`` runs one ``generate`` at a time per model), behind a lock, or for a worker thread. The serving
code (or inferwatch's middleware, or the launcher's hook into ``transformers serve``) opens an
:class:`Arrival` in a context variable; the first ``generate`` (or tracked request) of that context claims
it, so its TTFT and end-to-end latency are measured from the arrival (the server-side definition, as
OpenTelemetry's ``gen_ai.server.time_to_first_token``) and its queue time is observed.

Context variables follow asyncio tasks and ``asyncio.to_thread``/anyio worker threads by themselves; a
``threading.Thread`` or an executor job started while an arrival is open gets it through
:func:`propagate_to_threads`. This module does not import torch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class _WaitingGauge(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class Arrival:
    """One request as the server received it. Thread-safe: it is opened in the server's thread or task and
    claimed in whichever thread runs ``generate``.

    The request that claims it leaves how to end it early (:meth:`claim`'s ``on_disconnect``): a client
    that goes away before its answer was sent (:meth:`disconnect`, from the middleware) ends that request
    as ``cancelled`` at that moment, whatever the generating thread does afterwards."""

    __slots__ = (
        "_claimed",
        "_closed",
        "_lock",
        "_on_disconnect",
        "_waiting",
        "delivered_until",
        "disconnected_at",
        "on_claim",
        "publish_delivery",
        "series",
        "stop_on_disconnect",
        "time",
        "ttft_at_first_content",
    )

    def __init__(self, at: float | None = None) -> None:
        #: ``time.perf_counter()`` when the request arrived.
        self.time = time.perf_counter() if at is None else at
        self._lock = threading.Lock()
        self._waiting: _WaitingGauge | None = None
        self._claimed = False
        self._closed = False
        self._on_disconnect: Callable[[float], None] | None = None
        #: The series of the model whose request claimed the arrival (its ``model`` label), or None.
        self.series: Any = None
        #: ``time.perf_counter()`` when the client went away before its answer was sent, or None.
        self.disconnected_at: float | None = None
        #: ``time.perf_counter()`` when the last chunk of its response was handed to the server, or None:
        #: a token sampled later never reached the client (see :meth:`delivered`).
        self.delivered_until: float | None = None
        #: Hands each delivery to another process that runs the request (transformers serve's engine).
        self.publish_delivery: Callable[[float], None] | None = None
        #: Whether the generation for a client that went away is stopped (the middleware's opt-in).
        self.stop_on_disconnect = False
        #: Called once when a request claims the arrival (the middleware counts model requests with it).
        self.on_claim: Callable[[], Any] | None = None
        #: Whether the request's TTFT ends when its response's first content is sent, not when its first
        #: token is sampled: set by the HTTP edge that watches the response (docs/timing.md, "TTFT").
        self.ttft_at_first_content = False

    def wait_on(self, waiting: _WaitingGauge) -> None:
        """Count the request in a model's ``llm_requests_waiting`` until it is claimed or closed (once)."""
        with self._lock:
            if self._waiting is None and not self._claimed and not self._closed:
                waiting.inc()
                self._waiting = waiting

    @property
    def claimed(self) -> bool:
        """Whether a model's request ran for this arrival."""
        return self._claimed

    def claim(
        self, series: Any = None, on_disconnect: Callable[[float, float], None] | None = None
    ) -> float | None:
        """The arrival time for the first request that runs for it (no longer waiting); None after that:
        a second ``generate`` for the same server request is timed from its own entry.

        ``series``: the claiming model's; ``on_disconnect(at, undelivered_from)`` ends its request as
        cancelled at ``at``, the tokens it sampled after ``undelivered_from`` wasted
        (:meth:`undelivered_from`); called at once if the client has already gone."""
        with self._lock:
            if self._claimed:
                return None
            self._claimed = True
            self._stop_waiting()
            self.series = series
            self._on_disconnect = on_disconnect
            gone, claimed, self.on_claim = self.disconnected_at, self.on_claim, None
        if claimed is not None:
            claimed()
        if gone is not None and on_disconnect is not None:
            on_disconnect(gone, self.undelivered_from(gone))
        return self.time

    def undelivered_from(self, gone: float) -> float:
        """From when on what the request sampled never reached its client, which left at ``gone``: where
        the HTTP edge watched the response, after its last chunk sent (everything, if none was); else
        after ``gone``."""
        if not self.ttft_at_first_content:
            return gone
        return self.time if self.delivered_until is None else self.delivered_until

    def delivered(self, at: float) -> None:
        """A chunk of the response was handed to the server at ``at``: what was sampled until then may
        have reached the client."""
        self.delivered_until = at
        publish = self.publish_delivery
        if publish is not None:
            publish(at)

    def disconnect(self, at: float) -> None:
        """The client went away at ``at`` (``time.perf_counter()``) before its answer was sent (once)."""
        with self._lock:
            if self.disconnected_at is not None:
                return
            self.disconnected_at = at
            on_disconnect = self._on_disconnect
        if on_disconnect is not None:
            on_disconnect(at, self.undelivered_from(at))

    def close(self) -> None:
        """The server is done with the request (answered, failed or abandoned before it ran)."""
        with self._lock:
            self._closed = True
            self._on_disconnect = None  # the request it ended must not be kept alive by the arrival
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        if self._waiting is not None:
            self._waiting.dec()
            self._waiting = None


#: The arrival of the server request being handled in this context.
ARRIVAL: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("inferwatch_arrival", default=None)


@contextlib.contextmanager
def request_arrival(at: float | None = None) -> Iterator[Arrival]:
    """Open an arrival for the code inside the block: a server request that came in at ``at``
    (``time.perf_counter()``; default now). ``generate`` calls and tracked requests inside it are timed
    from the arrival, and their queue time is observed::

        arrived = time.perf_counter()          # as the request comes in
        ...                                    # queue, lock, tokenization
        with request_arrival(arrived):
            model.generate(...)
    """
    arrival = Arrival(at)
    token = ARRIVAL.set(arrival)
    try:
        yield arrival
    finally:
        arrival.close()
        ARRIVAL.reset(token)


_propagation_lock = threading.Lock()
_propagating = False


def propagate_to_threads() -> None:
    """Carry an open arrival into threads started (``threading.Thread.start``) and executor jobs submitted
    (``ThreadPoolExecutor.submit``) while it is open, as a serving handler does to run ``generate`` with a
    ``TextIteratorStreamer``. Installed once; threads and jobs started outside an arrival are untouched."""
    global _propagating
    with _propagation_lock:
        if _propagating:
            return
        _propagating = True
        threading.Thread.start = _carrying_start(threading.Thread.start)  # type: ignore[method-assign]
        executor = concurrent.futures.ThreadPoolExecutor
        executor.submit = _carrying_submit(executor.submit)  # type: ignore[method-assign]


def in_this_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, to be run elsewhere (another thread) in a copy of the calling context: its arrival."""
    return functools.partial(contextvars.copy_context().run, fn)


def _carrying_start(start: Any) -> Any:
    @functools.wraps(start)
    def wrapper(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
        arrival = ARRIVAL.get()
        if arrival is not None:
            run = self.run

            def run_with_arrival() -> None:
                ARRIVAL.set(arrival)
                run()

            self.run = run_with_arrival  # type: ignore[method-assign]
        return start(self, *args, **kwargs)

    return wrapper


def _carrying_submit(submit: Any) -> Any:
    @functools.wraps(submit)
    def wrapper(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if ARRIVAL.get() is not None:
            fn = in_this_context(fn)
        return submit(self, fn, *args, **kwargs)

    return wrapper
