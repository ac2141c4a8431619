"""The arithmetic of one request's timeline, the same for every way a request is served.

``generate`` (its eager steps and its compiled decode runs), continuous batching and ``track_request`` each
resolve their own marks (:mod:`.request`, :mod:`inferwatch.instrumentation.batching.batch_timeline`); what the
resolved times *mean* is decided here, once: where TTFT starts and ends, when the prefill began and how long
the request queued, where each token lands and the gaps between tokens, and what a finished request observes.
A device mark becomes a host time through an :class:`AnchorMapping`, whose anchor's lag is bounded the one way
docs/timing.md describes. Every observation goes into the caller's
:class:`~inferwatch.instrumentation.metrics.observations.Observations` batch.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from inferwatch.instrumentation.timing.clock import Anchor, Clock

if TYPE_CHECKING:
    from inferwatch.instrumentation.metrics.model_series import ModelSeries
    from inferwatch.instrumentation.metrics.observations import Observations
    from inferwatch.instrumentation.metrics.vocabulary import Status


class AnchorMapping:
    """Device marks placed on the host clock through one anchor, with the anchor's lag bounded from below.

    The anchor event completes "at once" only if the device starts work at once; a GPU coming out of idle
    was measured (docs/timing.md) to take a few hundred µs to run it, which would place every later mark
    that much too early. No mark completes before the host recorded it, so a mark that maps earlier than
    its recording proves the anchor late by at least the difference: :meth:`bound` takes that into
    :attr:`lag`, which every placed time includes."""

    __slots__ = ("anchor", "clock", "lag")

    def __init__(self, clock: Clock, anchor: Anchor) -> None:
        self.clock = clock
        self.anchor = anchor
        self.lag = 0.0

    def ready(self) -> bool:
        """Whether the anchor is complete (elapsed times need it; it completes at once, never assumed)."""
        event = self.anchor.event
        return event is None or self.clock.ready(event)

    def bound(self, mark: Any, recorded: float) -> None:
        """``mark`` was recorded at host time ``recorded``: the device reached it no earlier."""
        lag = recorded - self.clock.host_time(self.anchor, mark)
        if lag > self.lag:
            self.lag = lag

    def host_time(self, mark: Any) -> float:
        """When the device reached ``mark``, on the host clock."""
        return self.clock.host_time(self.anchor, mark) + self.lag

    def start_time(self, mark: Any, recorded: float) -> float:
        """When work after ``mark`` began: once the host had called it (``recorded``) and the device had
        finished what was queued before it, the later of the two, as the synchronize-based ground truth
        sees it (waiting for earlier work counts in TTFT, not in the prefill)."""
        return max(recorded, self.host_time(mark))

    def spans(self, marks: list[Any]) -> tuple[list[float], list[float]]:
        """Marks recorded in (start, end) pairs: each pair's duration and its end on the host clock."""
        durations, ends = self.clock.spans(self.anchor, marks)
        lag = self.lag
        return durations, [end + lag for end in ends]


#: Token steps a timeline remembers the ends of until its client's leaving is known: more than are
#: sampled between a client's last delivery and the server's noticing that it left (a second at 1000
#: tokens/s).
RECENT_STEPS = 1024


class TokenTimeline:
    """One request's times on the host clock, from its TTFT start to its last token.

    ``ttft_start`` is when the request arrived at the server where that is known (arrival.py), else when
    its caller entered; ``arrival`` is that arrival, or None (then no queue time is observed)."""

    __slots__ = (
        "_recent",
        "arrival",
        "first_token",
        "last_token",
        "max_gap",
        "prefill_start",
        "token_steps",
        "ttft_at_edge",
        "ttft_start",
        "undelivered_from",
        "wasted_steps",
    )

    def __init__(self, ttft_start: float, arrival: float | None) -> None:
        self.ttft_start = ttft_start
        self.arrival = arrival
        #: The HTTP edge observes the TTFT, at the response's first content (Arrival.ttft_at_first_content).
        self.ttft_at_edge = False
        self.prefill_start: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.token_steps = 0  # token steps placed (tokens per sequence)
        self.max_gap = 0.0
        #: Once its client went away: from when on its tokens never reached it (see :meth:`cancel_at`).
        self.undelivered_from: float | None = None
        self.wasted_steps = 0  # token steps placed after ``undelivered_from``: generated for nobody
        #: Behind the HTTP edge (:meth:`watched_by_edge`), the ends of the last token steps placed, with
        #: their tokens: those already placed when the client's leaving is known can have been sampled after
        #: its last delivery. Elsewhere the boundary is when its leaving was noticed, after every step
        #: placed by then, and nothing is kept.
        self._recent: collections.deque[tuple[float, int]] | None = None

    def watched_by_edge(self) -> None:
        """The HTTP edge watches the request's response: it observes the TTFT (at the first content
        sent), and a cancel's boundary is the last delivery, which can precede steps already placed."""
        self.ttft_at_edge = True
        self._recent = collections.deque(maxlen=RECENT_STEPS)

    def cancel_at(self, undelivered_from: float) -> None:
        """The client went away; the token steps that end after ``undelivered_from`` (its last delivery,
        Arrival.undelivered_from) never reached it and are wasted, those already placed included."""
        self.undelivered_from = undelivered_from
        if self._recent is not None:
            recent = tuple(self._recent)  # one C-level copy: the resolving thread may be placing steps
            self.wasted_steps += sum(tokens for end, tokens in recent if end > undelivered_from)
            self._recent = None

    def start_prefill(self, at: float, series: ModelSeries, observations: Observations) -> None:
        """The request's first forward began at ``at``: its queue time ends there."""
        self.prefill_start = at
        if self.arrival is not None:
            observations.observe(series.queue, max(0.0, at - self.arrival))

    def place(self, end: float, tokens: int, series: ModelSeries, observations: Observations) -> None:
        """``tokens`` per sequence became available at ``end``: the first ends the prefill and TTFT (unless
        the HTTP edge observes it), a later step is ``tokens`` inter-token latencies of a ``tokens``-th of
        its gap each."""
        previous, self.last_token = self.last_token, end
        self.token_steps += tokens
        if self.undelivered_from is not None:
            if end > self.undelivered_from:
                self.wasted_steps += tokens
        elif self._recent is not None:
            self._recent.append((end, tokens))
        if previous is None:
            self.first_token = end
            if not self.ttft_at_edge:
                observations.observe(series.ttft, end - self.ttft_start)
            start = self.prefill_start
            observations.observe(series.prefill, end - (self.ttft_start if start is None else start))
            return
        gap = end - previous
        if gap > self.max_gap:
            self.max_gap = gap
        per_token = gap / tokens
        for _ in range(tokens):
            observations.observe(series.itl, per_token)

    def place_steps(self, ends: list[float], series: ModelSeries, observations: Observations) -> None:
        """One token per sequence at each of ``ends`` (a compiled decode run's steps), as :meth:`place`
        would have them one by one, with their latencies observed as one batch."""
        if not ends:
            return
        if self.last_token is None:
            self.place(ends[0], 1, series, observations)
            ends = ends[1:]
            if not ends:
                return
        earlier = [self.last_token, *ends[:-1]]
        gaps = [later - before for before, later in zip(earlier, ends, strict=True)]
        self.max_gap = max(self.max_gap, *gaps)
        self.token_steps += len(ends)
        if self.undelivered_from is not None:
            self.wasted_steps += sum(1 for end in ends if end > self.undelivered_from)
        elif self._recent is not None:
            self._recent.extend((end, 1) for end in ends)
        self.last_token = ends[-1]
        observations.observe_all(series.itl, gaps)

    def observe_end(self, status: Status, at: float, series: ModelSeries, observations: Observations) -> None:
        """The request ended at ``at`` with ``status``: its outcome is counted, a served or cancelled one
        has its end-to-end latency (by outcome), and one that did not end served has its finish reason (a
        served one's, stop or length, is known once its tokens are: :meth:`observe_finish_reason`)."""
        observations.count(series.requests[status], 1)
        e2e = series.e2e_for(status)
        if e2e is not None:
            observations.observe(e2e, at - self.ttft_start)
        if status != "ok" and status in series.finished:
            observations.count(series.finished[status], 1)

    def observe_finish_reason(
        self, generated: int | None, limit: int | None, series: ModelSeries, observations: Observations
    ) -> None:
        """A served request's finish reason: ``length`` when its longest row generated ``limit`` tokens
        (the ``max_new_tokens`` it asked for), else ``stop`` (EOS, a stop string or another criterion);
        ``generated``: that row's tokens, None where only the token steps are known."""
        tokens = self.token_steps if generated is None else generated
        reason = "length" if limit is not None and tokens >= limit else "stop"
        observations.count(series.finished[reason], 1)

    def observe_decode(self, series: ModelSeries, observations: Observations) -> None:
        """A served request's decode, once every token is placed: its duration, its time per output
        token after the first, and its worst gap (no per-request latency for a cut-short one)."""
        steps = self.token_steps
        if steps >= 2:
            decode = self.last_token - self.first_token
            observations.observe(series.decode, decode)
            observations.observe(series.tpot, decode / (steps - 1))
            observations.observe(series.max_itl, self.max_gap)
        elif steps == 1:
            observations.observe(series.decode, 0.0)
