"""A generate call's or tracked request's marks: recorded in the hot path, resolved once the device is done.

Hooks only *record* (a CUDA event or a host reading, plus shapes). Marks are resolved when known to be
complete (``Clock.ready``): in a later step of the same request, once DRAIN_BATCH steps are pending
(generate's loop has synchronized by then), at the request's exit, or on the background thread if the
device is still busy; what the resolved times mean is the request's
:class:`~.timeline.TokenTimeline`. A drain observes its steps together
(:class:`Observations`): one histogram update per bucket touched rather than one per value.
Everything here runs in one thread at a time: the serving thread while the request runs, then the
background thread if the request was handed over (:meth:`Request.resolve` returned False).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import math
import threading
import time
from typing import Any, Protocol

import torch

from inferwatch.instrumentation.device.worker import Lane
from inferwatch.instrumentation.metrics.model_series import KVCacheSize, ModelSeries
from inferwatch.instrumentation.metrics.observations import Observations
from inferwatch.instrumentation.metrics.vocabulary import Phase, Status
from inferwatch.instrumentation.timing.clock import Clock, Fetched
from inferwatch.instrumentation.timing.timeline import AnchorMapping, TokenTimeline
from inferwatch.instrumentation.timing.tokens import LiveTokens

# A request whose marks never complete (a lost device) is given up after this long, counted as an error.
RESOLVE_DEADLINE_SECONDS = 120.0
# Steps (forwards and token marks) are resolved this many at a time: between two forwards the model evicts
# inferwatch's code and data from the CPU caches, so resolving one step per forward pays the cold start
# every time, and a drain's histogram updates are shared by its steps (docs/benchmarks.md, hook_cost.py).
# Observations appear at most this many steps late (16 decode steps of generate).
DRAIN_BATCH = 32
# A DecodeRun's marks are resolved this many at a time (64 compiled decode steps, about 0.2 s on the H200):
# its per-drain cost, the histogram updates, is shared by four times as many steps.
RUN_DRAIN_MARKS = 128


#: The request running in this thread (or asyncio task): forward hooks attribute their pass to it. The one
#: context-wide value on the request path, on purpose (docs/architecture.md, "State"): a tracked request
#: owns the forwards of whichever instrumented model runs inside it, so it cannot be one model's.
CURRENT_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "inferwatch_request", default=None
)


class Step:
    """One forward pass (``phase`` set) and/or the tokens that became available when it ended."""

    __slots__ = (
        "batch",
        "device",
        "end",
        "end_host",
        "flops",
        "phase",
        "processed",
        "read_bytes",
        "series",
        "start",
        "start_host",
        "tokens",
    )

    def __init__(
        self,
        *,
        series: ModelSeries,
        device: str,
        phase: Phase | None,
        start: Any,
        end: Any,
        tokens: int,
        start_host: float | None,
        end_host: float,
        read_bytes: float = 0.0,
        flops: float = 0.0,
        batch: int = 0,
        processed: int = 0,
    ) -> None:
        self.series = series  # the series of the model whose forward this is
        self.device = device
        self.phase = phase  # "prefill" | "decode" for a forward; None for a tracked token without one
        self.start = start
        self.end = end
        self.tokens = tokens  # tokens per sequence that were ready at `end`
        self.read_bytes = read_bytes  # a decode step: what it read (Footprint.decode_bytes)
        self.flops = flops  # a prefill: what it computed (Footprint.prefill_flops)
        # perf_counter read just before the marks were recorded: the device cannot reach a mark before
        # the host enqueued it, a bound the request's AnchorMapping takes.
        self.start_host = start_host
        self.end_host = end_host
        self.batch = batch  # sequences in the forward; 0 when its input had no batch dimension
        self.processed = processed  # input tokens of the forward (all sequences)

    def account_forward(self, clock: Clock, observations: Observations) -> None:
        """Observe the forward's device time, batch size and tokens (made when ``observations`` is
        flushed)."""
        seconds = clock.elapsed(self.start, self.end)
        series = self.series
        observations.forward(series, self.device, self.phase, seconds, self.read_bytes, self.flops)
        if self.batch:
            observations.observe(series.batch_size, self.batch)
        if self.phase == "prefill":
            observations.step_tokens(series, self.processed, 0)
        else:
            observations.step_tokens(series, 0, self.processed)


# -- how a request that raised ended: cancelled (its client went away), oom, or error --------------------

_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")
#: What serving stacks raise inside generate when the client went away: transformers serve's streamer
#: (``_GenerationCancelled``, by name: it is private) and the generic ways a task or generator is stopped.
_CANCELLATION_TYPES = (GeneratorExit, asyncio.CancelledError)
_CANCELLATION_NAMES = frozenset({"_GenerationCancelled", "GenerationCancelled"})


def is_oom(exc: BaseException) -> bool:
    """A CUDA OOM, or an allocator failure of another backend recognised by its message."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def is_cancellation(exc: BaseException) -> bool:
    """The request was abandoned by its client, not failed by the model."""
    return isinstance(exc, _CANCELLATION_TYPES) or type(exc).__name__ in _CANCELLATION_NAMES


def failure_status(exc: BaseException) -> Status:
    """The ``status`` label of a request that ended with ``exc``."""
    if is_cancellation(exc):
        return "cancelled"
    return "oom" if is_oom(exc) else "error"


class Rounds(Protocol):
    """An assisted generate's rounds as the stopping criteria count them (model.speculative)."""

    def round_tokens(self, length: int) -> int:
        """The tokens the round that made the sequence ``length`` long brought (0: not known)."""
        ...


@dataclasses.dataclass(frozen=True)
class RequestPath:
    """How a request's tokens are timed: one typed value, replaced (never edited) by :class:`Request`'s
    methods as generate settles, and read by the hooks (forward, criteria, compiled, speculative).

    The three parts are independent: an assisted generate's rounds are counted by the criteria's marks,
    and a compiled run can only begin for a request with no rounds.
    """

    #: Token times come from marks recorded after sampling (criteria.TokenMarkingCriteria), not forward
    #: ends; the forwards bring none.
    marks_sampling: bool = False
    #: The decode steps generate runs through its compiled call, once their shapes are settled: timed from
    #: around that call, the forward hooks stand aside.
    run: DecodeRun | None = None
    #: An assisted generate's rounds: how many tokens each brings.
    rounds: Rounds | None = None


#: Where every request starts: a token at each forward's end.
FORWARD_ENDS = RequestPath()


class DecodeRun:
    """The decode steps a request runs through generate's compiled call once its shapes are settled (from
    its third forward on, with a preallocated cache measured once): every step carries the same sequences
    and reads the same bytes, so a step is only the two marks around the call, kept flat in ``marks`` and
    resolved together by :meth:`Request.drain`, after the request's queued steps (every one of them was
    recorded before the run began). Its tokens count at each step's end mark: no mark after sampling
    (docs/timing.md, "The compiled decode step")."""

    __slots__ = ("batch", "device", "mark", "marks", "read_bytes")

    def __init__(self, clock: Clock, device: str, batch: int, read_bytes: float) -> None:
        self.mark = clock.marker()  # on the stream of the step that began the run
        self.device = device
        self.batch = batch  # sequences per step
        self.read_bytes = read_bytes  # what a step reads: the weights and the whole cache
        self.marks: list[Any] = []  # start, end, start, end, ...


class Request:
    """One generate call or tracked request, from entry to its last observation.

    ``entry``: perf_counter at the caller's first line (default: when the anchor was recorded, after
    inferwatch's own set-up); ``arrival``: when the request reached the server, where that is known
    (arrival.py): TTFT and E2E start there. ``prompt_length``: tokens per row that generate's output holds
    before the generated ones; ``token_limit``: the new tokens a row may generate (``max_new_tokens``),
    where known: a row that reached it finished for ``length``.

    It ends once, by :meth:`finish` when its caller returns, or earlier by :meth:`cancel` when its client
    went away (the serving thread may go on generating: those tokens are wasted)."""

    def __init__(
        self,
        series: ModelSeries,
        clock: Clock,
        *,
        background: Lane,
        owner: object = None,
        live: LiveTokens | None = None,
        entry: float | None = None,
        arrival: float | None = None,
        prompt_length: int = 0,
        token_limit: int | None = None,
    ) -> None:
        self.series = series
        #: Where what is left at :meth:`finish` resolves: the lane of the model (or of tracked requests).
        self.background = background
        self.owner = owner  # the generate instrumentation that opened it; None for a tracked request
        self.clock = clock
        self.mapping = AnchorMapping(clock, clock.start())
        if arrival is None:
            arrival_or_entry = self.mapping.anchor.host if entry is None else entry
        else:
            arrival_or_entry = arrival
        self.timeline = TokenTimeline(arrival_or_entry, arrival)
        self.prompt_length = prompt_length
        self.token_limit = token_limit
        #: How its tokens are timed; changed only by the methods below.
        self.path = FORWARD_ENDS
        self._anchored = False
        self.deadline = time.monotonic() + RESOLVE_DEADLINE_SECONDS
        self.forwards = 0  # forwards the hooks recorded (the first is the prefill; a DecodeRun's are not)
        self._pending: collections.deque[Step] = collections.deque()
        self._kv: KVCacheSize | None = None
        self._status: Status | None = None
        self._end_lock = threading.Lock()  # finish (the serving thread) against cancel (the server's)
        #: The request's tokens as the counters have them while it runs (one row, no prompt by default).
        self.live = live or LiveTokens(None, 1, math.inf)
        self._counts: Fetched | None = None
        self._resolved = False
        series.begin_running(id(self), self.timeline.ttft_start)

    # -- hot path: record and resolve what is already done ---------------------------------------------

    def add(self, step: Step) -> None:
        """Queue a step; it is observed by a later :meth:`drain` once its marks are complete."""
        self._pending.append(step)
        if step.phase is not None:
            self.forwards += 1

    def mark_tokens(self, device: str, tokens: int) -> None:
        """``tokens`` per sequence are ready now: a clock mark on the current stream (an event on CUDA)
        that counts when the device reaches it."""
        end_host = time.perf_counter()  # read before the mark: no mark completes before this
        end = self.clock.mark()
        self.add(
            Step(
                series=self.series,
                device=device,
                phase=None,
                start=None,
                end=end,
                tokens=tokens,
                start_host=None,
                end_host=end_host,
            )
        )

    def arrived(self, arrival: float | None, ttft_at_edge: bool = False) -> None:
        """The request reached the server at ``arrival`` (an Arrival's claim; None: unknown or claimed
        before): TTFT and E2E start there, and its queue time is observed. ``ttft_at_edge``: the HTTP edge
        observes its TTFT (Arrival.ttft_at_first_content)."""
        if arrival is not None:
            self.timeline.ttft_start = self.timeline.arrival = arrival
            if ttft_at_edge:
                self.timeline.watched_by_edge()
            self.series.running_since(id(self), arrival)

    def mark_tokens_at_sampling(self) -> None:
        """From now on generate's criteria mark each token after sampling; its forwards bring none."""
        self.path = dataclasses.replace(self.path, marks_sampling=True)

    def begin_run(self, run: DecodeRun) -> None:
        """From now on the request's decode steps are ``run``'s."""
        self.path = dataclasses.replace(self.path, run=run)

    def count_rounds(self, rounds: Rounds) -> None:
        """From now on the request is an assisted generate's, whose rounds bring ``rounds.round_tokens``."""
        self.path = dataclasses.replace(self.path, rounds=rounds)

    def set_kv(self, size: KVCacheSize | None) -> None:
        if size != self._kv:
            self.series.update_kv(self._kv, size)
            self._kv = size

    @property
    def kv_bytes(self) -> int:
        """The request's KV-cache bytes at its last measurement."""
        return 0 if self._kv is None else self._kv.bytes

    @property
    def kv_static(self) -> bool:
        """Whether the request's cache is preallocated (its size cannot change: measured once)."""
        return self._kv is not None and self._kv.capacity_tokens is not None

    def drain_batch(self) -> None:
        """:meth:`drain` once DRAIN_BATCH steps are pending."""
        if len(self._pending) >= DRAIN_BATCH:
            self.drain()

    def drain(self) -> bool:
        """Observe every leading step whose end mark is complete; True when none is left pending."""
        pending, clock, run, timeline = self._pending, self.clock, self.path.run, self.timeline
        if (pending or (run is not None and run.marks)) and not self._anchored:
            if not self.mapping.ready():
                return False
            self._anchored = True
        if timeline.first_token is None and self.mapping.anchor.event is not None:
            self._bound_anchor_lag()  # a host clock has no anchor lag
        observations = Observations()
        try:
            while pending:
                step = pending[0]
                if not clock.ready(step.end):
                    return False
                pending.popleft()
                self._resolve(step, observations)
            # The run's steps all came after the steps of the queue (see DecodeRun).
            return run is None or not run.marks or self._resolve_run(run, observations)
        finally:
            if timeline.prefill_start is not None or timeline.first_token is not None:
                self.live.count_prompt(self.series.prompt_tokens, observations)  # the prefill ran
            observations.flush()

    def _bound_anchor_lag(self) -> None:
        """Tighten the anchor's lag with every complete pending step, before the first token is placed.

        Each step gives a lower bound, tightest for a mark the device reached right after the host
        recorded it (a decode step's start: generate's loop waited for the device just before). The bound
        is fixed once the first token is observed, so later gaps (differences of marks) stay exact.
        """
        mapping, clock = self.mapping, self.clock
        for step in self._pending:
            if not clock.ready(step.end):
                break
            mapping.bound(step.end, step.end_host)
            if step.start is not None and step.start_host is not None:
                mapping.bound(step.start, step.start_host)

    def _resolve(self, step: Step, observations: Observations) -> None:
        clock, timeline = self.clock, self.timeline
        if step.phase is not None:
            step.account_forward(clock, observations)
            if timeline.prefill_start is None:
                # Mapped device times are never late (the anchor lag is a lower bound), so neither is
                # this start.
                start_host = step.start_host
                if start_host is None:
                    start = self.mapping.host_time(step.start)
                else:
                    start = self.mapping.start_time(step.start, start_host)
                timeline.start_prefill(start, self.series, observations)
            clock.release(step.start)
        if step.tokens:
            # Only a step that brought tokens is placed on the host clock (a forward followed by the
            # sampled-token mark is not: one elapsed_time less per decode step).
            end = self.mapping.host_time(step.end)
            series = self.series
            # The request's own state first: an observation that fails costs only itself.
            self.live.count_steps(timeline.token_steps, step.tokens, series.generation_tokens, observations)
            timeline.place(end, step.tokens, series, observations)
        clock.release(step.end)

    def _resolve_run(self, run: DecodeRun, observations: Observations) -> bool:
        """Observe the run's leading steps whose end mark is complete; True when none is left pending."""
        marks, clock = run.marks, self.clock
        count = len(marks)
        if not clock.ready(marks[-1]):  # marks on one stream complete in order: usually all or none
            count = 0
            while count < len(marks) and clock.ready(marks[count + 1]):
                count += 2
            if count == 0:
                return False
        done = marks[:count]
        del marks[:count]
        durations, ends = self.mapping.spans(done)
        clock.release_all(done)
        series, steps, timeline = self.series, len(durations), self.timeline
        series.heartbeat()
        observations.forwards(series, run.device, "decode", durations, read_bytes=run.read_bytes * steps)
        observations.observe_repeated(series.batch_size, run.batch, steps)
        observations.observe_repeated(series.step_tokens["decode"], run.batch, steps)
        self.live.count_steps(timeline.token_steps, len(ends), series.generation_tokens, observations)
        timeline.place_steps(ends, series, observations)
        return not marks

    # -- the end of a request --------------------------------------------------------------------------

    def cancel(self, at: float, undelivered_from: float | None = None) -> None:
        """The client went away at ``at`` (``time.perf_counter()``): the request ends ``cancelled`` now,
        whatever its caller does afterwards. The tokens it sampled after ``undelivered_from`` (default
        ``at``; Arrival.undelivered_from) never reached the client and are wasted. Its marks are still
        resolved when the caller returns (:meth:`finish`)."""
        if self._end("cancelled", at):
            self.timeline.cancel_at(at if undelivered_from is None else undelivered_from)

    def finish(self, status: Status, counts: Fetched | None = None) -> None:
        """The caller returned (or raised) with ``status``; ``counts``: the tokens generate generated, on
        their way to the host (from its output). A request cancelled earlier stays cancelled.

        Status, running requests, an OOM and end-to-end latency are recorded at the request's end; the rest
        by :meth:`resolve`, now if every mark is complete, else on the background thread.
        """
        self._counts = counts
        if not self._end(status, time.perf_counter()) and status == "oom":
            self.series.oom_events.inc()  # out of memory after its client left: an OOM all the same
        self.set_kv(None)
        self.background.resolve_or_defer(self, self.series.errors)

    def _end(self, status: Status, at: float) -> bool:
        """Record the request's end at ``at`` with ``status``, once; False if it had already ended."""
        with self._end_lock:
            if self._status is not None:
                return False
            self._status = status
        series = self.series
        series.end_running(id(self))
        if status == "oom":
            series.oom_events.inc()
        observations = Observations()
        self.timeline.observe_end(status, at, series, observations)
        observations.flush()
        return True

    def resolve(self) -> bool:
        """Make the per-request observations once every mark and count is on the host; False = not yet.
        Once it has returned True it does nothing more."""
        if self._resolved:
            return True
        if self._status not in ("ok", "cancelled"):
            # A failed request: keep what already resolved, drop marks that may never be reached.
            self.drain()
            self._pending.clear()
            self.path = dataclasses.replace(self.path, run=None)
            self._resolved = True
            return True
        counts = self._counts
        if not self.drain() or (counts is not None and not counts.ready()) or not self.live.prompt_ready():
            return False
        series = self.series
        self.clock.release(self.mapping.anchor)
        longest = None  # the tokens of the row that generated most
        if counts is not None:
            generated, longest = counts.value()
        elif self._status == "cancelled" or self.owner is None:
            # No output to count (a cancelled generate, a tracked request): every row's tokens so far.
            generated = self.live.rows * self.timeline.token_steps
        else:  # a generate whose output could not be counted (an error already reported): as counted
            generated = None
        observations = Observations()
        timeline = self.timeline
        if self._status == "ok":
            timeline.observe_decode(series, observations)
            timeline.observe_finish_reason(longest, self.token_limit, series, observations)
        if generated is not None:
            self.live.settle(series, generated, observations)
            if timeline.wasted_steps:
                wasted = min(generated, timeline.wasted_steps * self.live.rows)
                observations.count(series.wasted_tokens, wasted)
        self._resolved = True
        observations.flush()
        return True

    def expired(self) -> bool:
        return time.monotonic() > self.deadline


class LooseForward:
    """A forward that ran outside any request (a hand-written loop without tracking): only its device
    time is observed, once its end mark is complete."""

    __slots__ = ("clock", "deadline", "step")

    def __init__(self, clock: Clock, step: Step) -> None:
        self.clock = clock
        self.step = step
        self.deadline = time.monotonic() + RESOLVE_DEADLINE_SECONDS

    def resolve(self) -> bool:
        if not self.clock.ready(self.step.end):
            return False
        observations = Observations()
        self.step.account_forward(self.clock, observations)
        observations.flush()
        self.clock.release(self.step.start)
        self.clock.release(self.step.end)
        return True

    def expired(self) -> bool:
        return time.monotonic() > self.deadline
