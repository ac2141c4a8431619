"""Continuous batching: transformers' ``ContinuousBatchingManager`` measured request by request and step by
step, as its scheduler runs them.

Continuous batching never calls ``generate``: ``generate_batch``, ``init_continuous_batching`` (and the
manager it returns) and ``transformers serve --continuous-batching`` hand prompts to a manager whose
background thread schedules, in every step, a packed row of prompt chunks and decode tokens of many
requests. inferwatch wraps ``init_continuous_batching`` on the instrumented model (an instance attribute,
like ``generate``) and, on each manager it returns, instance attributes at points whose roles are the same
in transformers 5.17 and 5.24 (:data:`SUPPORTED_VERSIONS`):

* ``manager.add_request`` (the caller's thread): the request's arrival (an open
  :class:`~inferwatch.instrumentation.arrival.Arrival`, else the request's own ``created_time``);
  ``manager.cancel_request``: the client went away (``cancelled``);
* ``manager._create_batch_processor``, and on each batch processor it returns:
  ``inputs_and_outputs.prepare_batch_tensors`` (which requests the step carries, how many prompt and
  decode tokens, which of them get a token when it ends, how much of a new request's prompt the prefix
  cache held), ``model_runner.compute_batch`` (a clock mark
  before and after the step's work, on the processor's compute stream: no synchronization),
  ``scheduler.add_waiting_request`` (a request put back in the queue after it ran is a preemption),
  ``warmup`` (its dummy steps are not counted), ``prepare_next_batch`` (nothing to schedule: the loop is
  idle);
* ``manager.output_router``: ``deliver``/``deliver_batch`` hand finished requests to the user (status,
  token counts from the very output the user gets, end-to-end latency), ``fail_and_deliver`` says why a
  request failed (``error`` or ``oom``).

A token's time is the end of the step that sampled it on the device (the same definition as
``generate``'s sampled-token marks). Steps are resolved in order once their end mark is complete (at the
next delivery: the scheduler has read the tokens by then), so observations never wait for the device.
Resolution runs on the manager's thread; only what is left when its loop goes idle is handed to the
background sampler. The paged KV cache is read by the background sampler
(:class:`~inferwatch.instrumentation.paged.PagedCacheView`).

Where a version's internals differ, what can still be hooked is: without the request points the steps are
still measured, without the step points the forward hooks time each pass on its own. The reason is logged
once and counted in ``llm_instrumentation_errors_total{stage="batching"}``.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from inferwatch.instrumentation.arrival import ARRIVAL
from inferwatch.instrumentation.clock import Anchor
from inferwatch.instrumentation.errors import ErrorReporter
from inferwatch.instrumentation.paged import PagedCacheView
from inferwatch.instrumentation.request import RESOLVE_DEADLINE_SECONDS, call_timed_around, failure_status
from inferwatch.instrumentation.series import Observations
from inferwatch.instrumentation.worker import SAMPLER

if TYPE_CHECKING:
    from inferwatch.instrumentation.hooks import ModelInstrumentation

logger = logging.getLogger("inferwatch.instrumentation")

#: The transformers releases whose continuous-batching internals these hooks were read against.
SUPPORTED_VERSIONS = ((5, 17), (5, 24))
#: A CUDA anchor maps later events onto the host clock through a float32 elapsed time: a fresh one every
#: this many seconds keeps that mapping at microsecond resolution on a server that runs for days.
ANCHOR_REFRESH_SECONDS = 10.0

_WAITING, _RUNNING = "waiting", "running"


class _Tracked:
    """One request of the manager, from its arrival to its delivery."""

    __slots__ = (
        "arrival",
        "first_start",
        "first_token",
        "gap",
        "last_token",
        "prompt",
        "prompt_counted",
        "sampled",
        "state",
        "tokens",
    )

    def __init__(self, arrival: float, prompt: int) -> None:
        self.arrival = arrival
        self.prompt = prompt
        self.prompt_counted = False  # in llm_prompt_tokens_total, from its first step on
        self.state: str | None = _WAITING  # None once finished
        self.sampled = False  # a step that samples its next token has been scheduled
        self.first_start: float | None = None
        self.first_token: float | None = None
        self.last_token = 0.0
        self.tokens = 0  # placed, and counted in llm_generation_tokens_total as they were
        self.gap = 0.0


class _Step:
    """One step of the batch processor: its marks and what it carried."""

    __slots__ = (
        "anchor",
        "decode_tokens",
        "end",
        "end_host",
        "prefill_tokens",
        "scheduled",
        "sequences",
        "start",
        "start_host",
        "token_ids",
    )

    def __init__(self, composition: _Composition, anchor: Anchor) -> None:
        self.sequences = composition.sequences
        self.prefill_tokens = composition.prefill_tokens
        self.decode_tokens = composition.decode_tokens
        self.token_ids = composition.token_ids
        self.scheduled = composition.scheduled
        self.anchor = anchor
        self.start: Any = None
        self.end: Any = None
        self.start_host = 0.0
        self.end_host = 0.0

    @property
    def phase(self) -> str:
        if self.prefill_tokens and self.decode_tokens:
            return "mixed"
        return "decode" if self.decode_tokens else "prefill"


class _Composition:
    __slots__ = ("decode_tokens", "prefill_tokens", "scheduled", "sequences", "token_ids")

    def __init__(self) -> None:
        self.sequences = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.token_ids: list[str] = []  # requests that get a token when the step ends
        self.scheduled: list[str] = []  # requests that run for the first time


class _Finish:
    __slots__ = ("at", "generated", "request_id", "status")

    def __init__(self, request_id: str, status: str, generated: int | None, at: float) -> None:
        self.request_id = request_id
        self.status = status
        self.generated = generated  # from the delivered output; None: the tokens seen (cancelled)
        self.at = at


class BatchTimeline:
    """The requests and steps of one model's continuous batching, resolved in the order they happened.

    Requests arrive and are cancelled on the callers' threads; steps and deliveries happen on the manager's
    thread; resolution runs there or on the background sampler. One lock guards the shared state.
    """

    def __init__(self, instrumentation: ModelInstrumentation) -> None:
        self._instrumentation = instrumentation
        self.series = instrumentation.series
        self.errors = instrumentation.errors
        self._requests: dict[str, _Tracked] = {}
        self._pending: collections.deque[_Step | _Finish] = collections.deque()
        self._failures: dict[str, str] = {}
        self._last_failure: int | None = None
        self._lock = threading.Lock()
        self._composition: _Composition | None = None
        self._anchor: Anchor | None = None
        self._anchor_host = 0.0
        self._anchor_lag: dict[int, float] = {}
        self._deferred = False
        self.deadline = 0.0
        self.warming_up = False

    # -- requests (callers' threads and the manager's) -------------------------------------------------

    def arrive(self, request_id: str, arrival: float | None, created: float, prompt: int) -> None:
        """A request was handed to the manager: ``arrival`` from an open Arrival, else ``created``."""
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None:
                self._requests[request_id] = _Tracked(created if arrival is None else arrival, prompt)
                self.series.waiting.inc()
            elif arrival is not None and tracked.first_token is None:
                tracked.arrival = arrival  # the scheduler saw it first; the server's arrival is earlier

    def requeue(self, state: Any) -> None:
        """The scheduler queued ``state``: a new request, or one taken off the device (preempted)."""
        request_id = state.request_id
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is not None and tracked.state == _RUNNING:
                tracked.state = _WAITING
                self.series.running.dec()
                self.series.waiting.inc()
                self.series.kv_preemptions.inc()
                return
        if tracked is None:
            self.arrive(request_id, None, state.created_time, len(state.initial_tokens))

    def cancel(self, request_id: str) -> None:
        """The client went away (``manager.cancel_request``)."""
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
                failed = output.error is not None
                status = self._failures.pop(output.request_id, "error") if failed else "ok"
                self._finish(output.request_id, status, len(output.generated_tokens))
        self.drain()

    def _finish(self, request_id: str, status: str, generated: int | None) -> None:
        at = time.perf_counter()
        with self._lock:
            tracked = self._requests.get(request_id)
            if tracked is None or tracked.state is None:
                return
            (self.series.running if tracked.state == _RUNNING else self.series.waiting).dec()
            tracked.state = None
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
        token_ids, scheduled = composition.token_ids, composition.scheduled
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
                    token_ids.append(request_id)
                    if tracked is not None:
                        tracked.sampled = True
                if tracked is not None and tracked.state == _WAITING:
                    tracked.state = _RUNNING
                    self.series.waiting.dec()
                    self.series.running.inc()
                    if tracked.first_start is None:
                        scheduled.append(request_id)
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
                clock = self._instrumentation.placement.clock
                step = _Step(composition, self._current_anchor(clock))
                step.start_host = time.perf_counter()  # read before the mark: no mark completes before it
                step.start = clock.mark_on(stream)
            except Exception as exc:
                self.errors.report("batching", exc)
                step = None
        result = call_timed_around(compute, args, kwargs)
        if step is not None:
            try:
                step.end_host = time.perf_counter()
                step.end = clock.mark_on(stream)
                self._pending.append(step)
                self.series.heartbeat()
            except Exception as exc:
                self.errors.report("batching", exc)
        return result

    def _current_anchor(self, clock: Any) -> Anchor:
        now = time.perf_counter()
        if self._anchor is None or now - self._anchor_host > ANCHOR_REFRESH_SECONDS:
            self._anchor, self._anchor_host = clock.start(), now
        return self._anchor

    # -- resolution ------------------------------------------------------------------------------------

    def drain_or_defer(self) -> None:
        """The manager's loop found nothing to schedule: resolve what is complete and leave the rest to
        the background sampler. While the loop runs, each step resolves the ones before it instead: a
        sampler polling the device's events meanwhile costs the loop GIL and driver time (measured on the
        H200: ~10 % of a host-bound loop's throughput)."""
        if not self.drain() and not self._deferred:
            self._deferred = True
            self.deadline = time.monotonic() + RESOLVE_DEADLINE_SECONDS
            SAMPLER.defer(self, self.errors)

    def complete(self) -> bool:
        """The sampler's entry: True once nothing is pending."""
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
        clock = self._instrumentation.placement.clock
        observations = Observations()
        with self._lock:
            pending = self._pending
            try:
                while pending:
                    item = pending[0]
                    if isinstance(item, _Step):
                        if not clock.ready(item.end) or not _anchor_ready(clock, item.anchor):
                            return False
                        pending.popleft()
                        try:
                            self._resolve_step(clock, item, observations)
                        except Exception as exc:
                            self.errors.report("resolve", exc)
                    else:
                        pending.popleft()
                        try:
                            self._resolve_finish(item)
                        except Exception as exc:
                            self.errors.report("resolve", exc)
                return True
            finally:
                try:
                    observations.flush()
                except Exception as exc:
                    self.errors.report("resolve", exc)

    def _host_time(self, clock: Any, step: _Step, mark: Any, recorded: float) -> float:
        """``mark`` on the host clock; its anchor's lag is bounded the way Request bounds it."""
        anchor = step.anchor
        mapped = clock.host_time(anchor, mark)
        key = id(anchor)
        lag = max(self._anchor_lag.get(key, 0.0), recorded - mapped)
        self._anchor_lag[key] = lag
        if len(self._anchor_lag) > 4:
            for stale in list(self._anchor_lag)[:-4]:
                del self._anchor_lag[stale]
        return mapped + lag

    def _resolve_step(self, clock: Any, step: _Step, observations: Observations) -> None:
        series = self.series
        seconds = clock.elapsed(step.start, step.end)
        placement = self._instrumentation.placement
        phase = step.phase
        if phase == "decode":
            work = placement.footprint.decode_read_bytes + series.paged_used_bytes
        elif phase == "prefill":
            work = 2.0 * placement.footprint.matmul_count * step.prefill_tokens
        else:
            work = 0.0  # a mixed step counts in the busy ratio, not in the prefill or decode ratios
        observations.forward(series, placement.label, phase, seconds, work)
        observations.observe(series.batch_size, step.sequences)
        observations.step_tokens(series, step.prefill_tokens, step.decode_tokens)
        start = self._host_time(clock, step, step.start, step.start_host)
        end = self._host_time(clock, step, step.end, step.end_host)
        start = max(start, step.start_host)
        requests = self._requests
        for request_id in step.scheduled:
            tracked = requests.get(request_id)
            if tracked is not None and tracked.first_start is None:
                tracked.first_start = start
                observations.observe(series.queue, max(0.0, start - tracked.arrival))
                observations.count(series.prompt_tokens, tracked.prompt)
                tracked.prompt_counted = True
        placed = 0
        for request_id in step.token_ids:
            tracked = requests.get(request_id)
            if tracked is None:
                continue
            placed += 1
            if tracked.first_token is None:
                tracked.first_token = end
                observations.observe(series.ttft, end - tracked.arrival)
                begun = tracked.first_start if tracked.first_start is not None else tracked.arrival
                observations.observe(series.prefill, end - begun)
            else:
                gap = end - tracked.last_token
                tracked.gap = max(tracked.gap, gap)
                observations.observe(series.itl, gap)
            tracked.last_token = end
            tracked.tokens += 1
        observations.count(series.generation_tokens, placed)
        clock.release(step.start)
        clock.release(step.end)

    def _resolve_finish(self, finish: _Finish) -> None:
        tracked = self._requests.pop(finish.request_id, None)
        if tracked is None:
            return
        series, status = self.series, finish.status
        series.requests[status].inc()
        if status == "ok":
            series.e2e.observe(finish.at - tracked.arrival)
            series.observe_decode(tracked.tokens, tracked.first_token, tracked.last_token, tracked.gap)
        if status in ("ok", "cancelled"):
            generated = tracked.tokens if finish.generated is None else finish.generated
            counted_prompt = tracked.prompt if tracked.prompt_counted else 0
            series.settle_request_tokens(tracked.prompt, generated, counted_prompt, tracked.tokens)


def _anchor_ready(clock: Any, anchor: Anchor) -> bool:
    return anchor.event is None or clock.ready(anchor.event)


def _wrap(owner: Any, name: str, make: Any) -> None:
    """Replace ``owner.name`` by ``make(original)`` as an instance attribute (the class is never patched);
    once: the same processor or router can be reached twice (warmup, a persistent manager)."""
    if getattr(owner.__dict__.get(name), "_inferwatch_wrapped", False):
        return
    original = getattr(owner, name)
    wrapper = functools.wraps(original)(make(original))
    wrapper._inferwatch_wrapped = True
    setattr(owner, name, wrapper)


class BatchingHooks:
    """Attaches a model's :class:`BatchTimeline` to the managers its ``init_continuous_batching`` returns."""

    def __init__(self, instrumentation: ModelInstrumentation) -> None:
        self._instrumentation = instrumentation
        self.timeline = BatchTimeline(instrumentation)
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._warned: set[str] = set()

    def wrap_init(self, original: Any) -> Any:
        @functools.wraps(original)
        def init_continuous_batching(*args: Any, **kwargs: Any) -> Any:
            manager = original(*args, **kwargs)
            if self._instrumentation.active:
                self.attach(manager)
            return manager

        return init_continuous_batching

    def _degrade(self, what: str, exc: BaseException) -> None:
        self._instrumentation.errors.report("batching", exc)
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(
                "inferwatch: continuous batching of this transformers version differs from %s: %s",
                " and ".join(f"{major}.{minor}" for major, minor in SUPPORTED_VERSIONS),
                what,
            )

    def attach(self, manager: Any) -> None:
        """Hook ``manager`` (once: a persistent manager is returned again by later calls)."""
        try:
            if manager is None or manager in self._managers:
                return
            self._managers.add(manager)
        except Exception as exc:
            self._degrade("the manager cannot be hooked; only the forward passes are timed", exc)
            return
        timeline = self.timeline
        try:
            _wrap(manager, "add_request", self._add_request)
            errors = timeline.errors
            _wrap(manager, "cancel_request", _observing(timeline.cancel, errors, before=False))
            router = manager.output_router
            _wrap(router, "fail_and_deliver", _observing(timeline.fail, errors, before=True))
            _wrap(router, "deliver", _observing(timeline.deliver_one, errors, before=False))
            _wrap(router, "deliver_batch", _observing(timeline.deliver, errors, before=False))
        except Exception as exc:
            self._degrade("requests are not followed; steps are", exc)
        try:
            _wrap(manager, "_create_batch_processor", self._processor_factory)
        except Exception as exc:
            self._degrade("steps are not followed; the forward passes are timed one by one", exc)

    def _add_request(self, original: Any) -> Any:
        timeline = self.timeline

        def add_request(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            created = time.perf_counter()
            request_id = original(input_ids, *args, **kwargs)
            try:
                if request_id is not None:
                    arrival = ARRIVAL.get()
                    arrived = None if arrival is None else arrival.claim()
                    timeline.arrive(request_id, arrived, created, len(input_ids))
            except Exception as exc:
                timeline.errors.report("batching", exc)
            return request_id

        return add_request

    def _processor_factory(self, original: Any) -> Any:
        def create_batch_processor(*args: Any, **kwargs: Any) -> Any:
            processor = original(*args, **kwargs)
            try:
                self._attach_processor(processor)
            except Exception as exc:
                self._degrade("steps are not followed; the forward passes are timed one by one", exc)
            return processor

        return create_batch_processor

    def _attach_processor(self, processor: Any) -> None:
        timeline = self.timeline
        io = processor.inputs_and_outputs
        runner = processor.model_runner
        stream = getattr(io, "compute_stream", None)
        requeue = _observing(timeline.requeue, timeline.errors, before=True)
        _wrap(processor.scheduler, "add_waiting_request", requeue)
        try:
            view = PagedCacheView(processor.cache)
        except Exception as exc:
            view = None
            self._degrade("its paged KV cache is not read", exc)
        prefix_sharing = view is not None and view.prefix_sharing

        def prepare(original: Any) -> Any:
            def prepare_batch_tensors(*args: Any, **kwargs: Any) -> Any:
                try:
                    batch = kwargs["requests_in_batch"] if "requests_in_batch" in kwargs else args[0]
                    timeline.compose(batch, prefix_sharing)
                except Exception as exc:
                    timeline.errors.report("batching", exc)
                return original(*args, **kwargs)

            return prepare_batch_tensors

        def compute(original: Any) -> Any:
            def compute_batch(*args: Any, **kwargs: Any) -> Any:
                return timeline.run_step(stream, original, args, kwargs)

            return compute_batch

        def idle(original: Any) -> Any:
            def prepare_next_batch(*args: Any, **kwargs: Any) -> Any:
                scheduled = original(*args, **kwargs)
                if not scheduled:
                    try:
                        timeline.drain_or_defer()
                    except Exception as exc:
                        timeline.errors.report("batching", exc)
                return scheduled

            return prepare_next_batch

        def warmup(original: Any) -> Any:
            def warmup_steps(*args: Any, **kwargs: Any) -> Any:
                timeline.warming_up = True
                try:
                    return original(*args, **kwargs)
                finally:
                    timeline.warming_up = False

            return warmup_steps

        _wrap(io, "prepare_batch_tensors", prepare)
        _wrap(runner, "compute_batch", compute)
        _wrap(processor, "warmup", warmup)
        _wrap(processor, "prepare_next_batch", idle)
        if view is not None:
            self._instrumentation.series.watch_paged_cache(view)


def _observing(observe: Any, errors: ErrorReporter, *, before: bool) -> Any:
    """A wrapper factory: the original call with ``observe(*args, **kwargs)`` before or after it; what
    ``observe`` raises is counted, never passed on."""

    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                _observe(observe, errors, args, kwargs)
            result = original(*args, **kwargs)
            if not before:
                _observe(observe, errors, args, kwargs)
            return result

        return wrapper

    return make


def _observe(observe: Any, errors: ErrorReporter, args: tuple, kwargs: dict) -> None:
    try:
        observe(*args, **kwargs)
    except Exception as exc:
        errors.report("batching", exc)
