"""Continuous batching's requests and steps, resolved in the order they happened: what
:mod:`.manager`'s hooks on a ``ContinuousBatchingManager`` feed.

A token's time is the end of the step that sampled it on the device (the same definition as
``generate``'s sampled-token marks). Steps are resolved in order once their end mark is complete (at the
next delivery: the scheduler has read the tokens by then), so observations never wait for the device.
Resolution runs on the manager's thread; only what is left when its loop goes idle is handed to the
background thread. What a resolved time means is each request's
:class:`~inferwatch.instrumentation.timing.timeline.TokenTimeline`.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from inferwatch.instrumentation.metrics.observations import Observations
from inferwatch.instrumentation.metrics.vocabulary import ForwardPhase, Status
from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.timing.request import RESOLVE_DEADLINE_SECONDS, failure_status
from inferwatch.instrumentation.timing.timeline import AnchorMapping, TokenTimeline

#: A CUDA anchor maps later events onto the host clock through a float32 elapsed time: a fresh one every
#: this many seconds keeps that mapping at microsecond resolution on a server that runs for days.
ANCHOR_REFRESH_SECONDS = 10.0

_WAITING, _RUNNING = "waiting", "running"
#: Requests cancelled while the manager may still schedule them, remembered to count the tokens it
#: generates for them anyway as wasted; the oldest are forgotten beyond this many.
_ABANDONED_KEPT = 1024


class _Tracked:
    """One request of the manager, from its arrival to its delivery."""

    __slots__ = ("limit", "prompt", "prompt_counted", "sampled", "state", "timeline")

    def __init__(self, arrival: float, prompt: int, limit: int | None) -> None:
        self.timeline = TokenTimeline(arrival, arrival)  # TTFT and the queue start at its arrival
        self.prompt = prompt
        self.limit = limit  # its max_new_tokens, where known
        self.prompt_counted = False  # in llm_prompt_tokens_total, from its first step on
        self.state: str | None = _WAITING  # None once finished
        self.sampled = False  # a step that samples its next token has been scheduled

    def arrived(self, arrival: float, ttft_at_edge: bool) -> None:
        """The server's arrival of the request, earlier than the scheduler's; ``ttft_at_edge``: the HTTP
        edge observes its TTFT (Arrival.ttft_at_first_content)."""
        self.timeline.ttft_start = self.timeline.arrival = arrival
        if ttft_at_edge:
            self.timeline.watched_by_edge()


class _Step:
    """One step of the batch processor: its marks and what it carried."""

    __slots__ = (
        "decode_tokens",
        "end",
        "end_host",
        "first_scheduled",
        "mapping",
        "prefill_tokens",
        "sampling",
        "sequences",
        "start",
        "start_host",
    )

    def __init__(self, composition: _Composition, mapping: AnchorMapping) -> None:
        self.sequences = composition.sequences
        self.prefill_tokens = composition.prefill_tokens
        self.decode_tokens = composition.decode_tokens
        self.sampling = composition.sampling
        self.first_scheduled = composition.first_scheduled
        self.mapping = mapping
        self.start: Any = None
        self.end: Any = None
        self.start_host = 0.0
        self.end_host = 0.0

    @property
    def phase(self) -> ForwardPhase:
        if self.prefill_tokens and self.decode_tokens:
            return "mixed"
        return "decode" if self.decode_tokens else "prefill"


class _Composition:
    """What the next step carries, from the scheduler's batch."""

    __slots__ = ("decode_tokens", "first_scheduled", "prefill_tokens", "sampling", "sequences")

    def __init__(self) -> None:
        self.sequences = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.sampling: list[str] = []  # ids of the requests that get a token when the step ends
        self.first_scheduled: list[str] = []  # ids of the requests that run for the first time


class _Finish:
    __slots__ = ("at", "generated", "request_id", "status")

    def __init__(self, request_id: str, status: Status, generated: int | None, at: float) -> None:
        self.request_id = request_id
        self.status = status
        self.generated = generated  # from the delivered output; None: the tokens seen (cancelled)
        self.at = at


class BatchTimeline:
    """The requests and steps of one model's continuous batching, resolved in the order they happened.

    Requests arrive and are cancelled on the callers' threads; steps and deliveries happen on the manager's
    thread; resolution runs there or on the background thread. One lock guards the shared state.
    """

    def __init__(self, model: ModelContext) -> None:
        self._model = model
        self.series = model.series
        self.errors = model.errors
        self._requests: dict[str, _Tracked] = {}
        self._pending: collections.deque[_Step | _Finish] = collections.deque()
        self._failures: dict[str, str] = {}
        self._abandoned: dict[str, None] = {}  # cancelled, maybe still scheduled (see _ABANDONED_KEPT)
        self._last_failure: int | None = None
        self._lock = threading.Lock()
        self._composition: _Composition | None = None
        self._mapping: AnchorMapping | None = None
        self._deferred = False
        self.deadline = 0.0
        self.warming_up = False

    # -- requests (callers' threads and the manager's) -------------------------------------------------

    def arrive(
        self,
        request_id: str,
        arrival: float | None,
        created: float,
        prompt: int,
        limit: int | None = None,
        ttft_at_edge: bool = False,
    ) -> None:
        """A request was handed to the manager: ``arrival`` from an open Arrival, else ``created``;
        ``limit``: its ``max_new_tokens``; ``ttft_at_edge``: the arrival's HTTP edge observes its TTFT."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None:
                tracked = self._requests[request_id] = _Tracked(created, prompt, limit)
                if arrival is not None:
                    tracked.arrived(arrival, ttft_at_edge)
                self.series.waiting.inc()
            elif arrival is not None and tracked.timeline.first_token is None:
                tracked.arrived(arrival, ttft_at_edge)  # the scheduler saw it first
                self.series.running_since((id(self), request_id), arrival)

    def requeue(self, state: Any) -> None:
        """The scheduler queued ``state``: a new request, or one taken off the device (preempted)."""
        request_id = state.request_id
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is not None and tracked.state == _RUNNING:
                tracked.state = _WAITING
                self.series.end_running((id(self), request_id))
                self.series.waiting.inc()
                self.series.kv_preemptions.inc()
                return
        if tracked is None:
            self.arrive(request_id, None, state.created_time, len(state.initial_tokens))

    def cancel(self, request_id: str, undelivered_from: float | None = None) -> None:
        """The client went away (``manager.cancel_request``, or the middleware saw it go); the tokens
        sampled for it after ``undelivered_from`` (its last delivery: Arrival.undelivered_from; default
        now) never reached it and are wasted."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is not None and tracked.state is not None:
                boundary = time.perf_counter() if undelivered_from is None else undelivered_from
                tracked.timeline.cancel_at(boundary)
        self._finish(request_id, "cancelled", None)

    def fail(self, state: Any, error: BaseException) -> None:
        """Why ``state``'s request is about to be delivered as failed."""
        status = failure_status(error)
        self._failures[state.request_id] = status
        if status == "oom" and self._last_failure != id(error):
            self.series.oom_events.inc()  # once per error: a batch error fails every request of the step
        self._last_failure = id(error)

    def deliver_one(self, output: Any) -> None:
        self.deliver((output,))

    def deliver(self, outputs: Any) -> None:
        """The router handed ``outputs`` to the user: finish those that are done, then resolve."""
        for output in outputs:
            if output.is_finished():
                self._abandoned.pop(output.request_id, None)
                failed = output.error is not None
                status = self._failures.pop(output.request_id, "error") if failed else "ok"
                self._finish(output.request_id, status, len(output.generated_tokens))
        self.drain()

    def _finish(self, request_id: str, status: Status, generated: int | None) -> None:
        at = time.perf_counter()
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None or tracked.state is None:
                return
            if tracked.state == _RUNNING:
                self.series.end_running((id(self), request_id))
            else:
                self.series.waiting.dec()
            tracked.state = None
            if status == "ok" and tracked.limit is not None and tracked.limit <= 0:
                status = "rejected"  # asked for no token: the client's mistake, as in generate
            elif status == "cancelled":
                self._abandoned[request_id] = None
                if len(self._abandoned) > _ABANDONED_KEPT:
                    del self._abandoned[next(iter(self._abandoned))]
            self._pending.append(_Finish(request_id, status, generated, at))

    # -- steps (the manager's thread) ------------------------------------------------------------------

    def compose(self, requests_in_batch: Any, prefix_sharing: bool = False) -> None:
        """What the next step carries (``FutureRequestState``: state, has_new_token, query_length).

        ``prefix_sharing``: the scheduler looked each request up in the cache's prefix cache before it
        scheduled it for the first time; what matched is the request's past (``position_offset``: a new
        request has none otherwise) when its first step is composed."""
        self.drain()  # the previous steps: the scheduler has read their tokens, their marks are done
        if self.warming_up:
            self._composition = None
            return
        composition = _Composition()
        composition.sequences = len(requests_in_batch)
        sampling, first_scheduled = composition.sampling, composition.first_scheduled
        prefill = decode = 0
        looked_up = hit = 0
        requests = self._requests
        with self._lock:
            for future in requests_in_batch:
                state = future.state
                request_id = state.request_id
                tracked = requests.get(request_id)
                # The scheduler marks a request DECODING as soon as its last prompt chunk is scheduled: a
                # decode token is a single token of a request that has already sampled one.
                sampled = tracked.sampled if tracked is not None else bool(state.generated_tokens)
                if sampled and future.query_length == 1:
                    decode += 1
                else:
                    prefill += future.query_length
                if future.has_new_token:
                    sampling.append(request_id)
                    if tracked is not None:
                        tracked.sampled = True
                if tracked is not None and tracked.state == _WAITING:
                    tracked.state = _RUNNING
                    self.series.waiting.dec()
                    self.series.begin_running((id(self), request_id), tracked.timeline.ttft_start)
                    if tracked.timeline.prefill_start is None:
                        first_scheduled.append(request_id)
                        if prefix_sharing:
                            looked_up += tracked.prompt
                            hit += min(state.position_offset, tracked.prompt)
        composition.prefill_tokens, composition.decode_tokens = prefill, decode
        self._composition = composition
        if looked_up:
            self.series.count_prefix_lookups(hit, looked_up - hit)

    def run_step(self, stream: Any, compute: Any, args: tuple, kwargs: dict) -> Any:
        """Run one step's ``compute(*args, **kwargs)`` between two clock marks on ``stream``."""
        composition, self._composition = self._composition, None
        step = clock = None
        if composition is not None:
            try:
                clock = self._model.placement.clock
                step = _Step(composition, self._current_mapping(clock))
                step.start_host = time.perf_counter()  # read before the mark: no mark completes before it
                step.start = clock.mark_on(stream)
            except Exception as exc:
                self.errors.report("batching", exc)
                step = None
        result = self._model.call_timed_around(compute, args, kwargs)
        if step is not None:
            try:
                step.end_host = time.perf_counter()
                step.end = clock.mark_on(stream)
                self._pending.append(step)
                self.series.heartbeat()
            except Exception as exc:
                self.errors.report("batching", exc)
        return result

    def _current_mapping(self, clock: Any) -> AnchorMapping:
        mapping = self._mapping
        if (
            mapping is None
            or mapping.clock is not clock
            or time.perf_counter() - mapping.anchor.host > ANCHOR_REFRESH_SECONDS
        ):
            mapping = self._mapping = AnchorMapping(clock, clock.start())
        return mapping

    # -- resolution ------------------------------------------------------------------------------------

    def drain_or_defer(self) -> None:
        """The manager's loop found nothing to schedule: resolve what is complete and leave the rest to
        the background thread. While the loop runs, each step resolves the ones before it instead: a
        sampler polling the device's events meanwhile costs the loop GIL and driver time (measured on the
        H200: ~10 % of a host-bound loop's throughput)."""
        if not self.drain() and not self._deferred:
            self._deferred = True
            self.deadline = time.monotonic() + RESOLVE_DEADLINE_SECONDS
            self._model.background.defer(self, self.errors)

    def resolve(self) -> bool:
        """The background thread's entry: True once nothing is pending."""
        done = self.drain()
        if done:
            self._deferred = False
        return done

    def expired(self) -> bool:
        if time.monotonic() > self.deadline:
            self._deferred = False
            return True
        return False

    def drain(self) -> bool:
        """Observe every leading step whose end mark is complete, and the finishes behind them."""
        clock = self._model.placement.clock
        observations = Observations()
        with self._lock:
            pending = self._pending
            try:
                while pending:
                    item = pending[0]
                    if isinstance(item, _Step):
                        if not clock.ready(item.end) or not item.mapping.ready():
                            return False
                        pending.popleft()
                        try:
                            self._resolve_step(clock, item, observations)
                        except Exception as exc:
                            self.errors.report("resolve", exc)
                    else:
                        pending.popleft()
                        try:
                            self._resolve_finish(item, observations)
                        except Exception as exc:
                            self.errors.report("resolve", exc)
                return True
            finally:
                try:
                    observations.flush()
                except Exception as exc:
                    self.errors.report("resolve", exc)

    def _resolve_step(self, clock: Any, step: _Step, observations: Observations) -> None:
        series = self.series
        seconds = clock.elapsed(step.start, step.end)
        placement = self._model.placement
        phase, footprint = step.phase, placement.footprint
        read_bytes = flops = 0.0  # a mixed step counts in the busy ratio, not in the prefill or decode ratios
        if phase == "decode":
            read_bytes = footprint.decode_bytes(series.paged_used_bytes)
        elif phase == "prefill":
            flops = footprint.prefill_flops(step.prefill_tokens)
        observations.forward(series, placement.label, phase, seconds, read_bytes, flops)
        observations.observe(series.batch_size, step.sequences)
        observations.step_tokens(series, step.prefill_tokens, step.decode_tokens)
        mapping = step.mapping
        mapping.bound(step.start, step.start_host)
        start = mapping.start_time(step.start, step.start_host)
        mapping.bound(step.end, step.end_host)
        end = mapping.host_time(step.end)
        requests = self._requests
        for request_id in step.first_scheduled:
            tracked = requests.get(request_id)
            if tracked is not None and tracked.timeline.prefill_start is None:
                tracked.timeline.start_prefill(start, series, observations)
                observations.count(series.prompt_tokens, tracked.prompt)
                tracked.prompt_counted = True
        placed = wasted = 0
        for request_id in step.sampling:
            tracked = requests.get(request_id)
            if tracked is not None:
                placed += 1
                tracked.timeline.place(end, 1, series, observations)
            elif request_id in self._abandoned:  # sampled for a client that has gone
                wasted += 1
        observations.count(series.generation_tokens, placed + wasted)
        if wasted:
            observations.count(series.wasted_tokens, wasted)
        clock.release(step.start)
        clock.release(step.end)

    def _resolve_finish(self, finish: _Finish, observations: Observations) -> None:
        tracked = self._requests.pop(finish.request_id, None)
        if tracked is None:
            return
        series, status, timeline = self.series, finish.status, tracked.timeline
        timeline.observe_end(status, finish.at, series, observations)
        if status == "ok":
            timeline.observe_decode(series, observations)
            timeline.observe_finish_reason(finish.generated, tracked.limit, series, observations)
        if status in ("ok", "cancelled"):
            generated = timeline.token_steps if finish.generated is None else finish.generated
            counted_prompt = tracked.prompt if tracked.prompt_counted else 0
            series.settle_request_tokens(
                tracked.prompt, generated, counted_prompt, timeline.token_steps, observations
            )
        if status == "cancelled" and timeline.wasted_steps:
            # Sampled after its last delivery, before the manager knew: the later ones are the abandoned's.
            observations.count(series.wasted_tokens, timeline.wasted_steps)
