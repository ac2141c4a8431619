"""Continuous batching: transformers' ``ContinuousBatchingManager`` measured request by request and step by
step, as its scheduler runs them.

Continuous batching never calls ``generate``: ``generate_batch``, ``init_continuous_batching`` (and the
manager it returns) and ``transformers serve --continuous-batching`` hand prompts to a manager whose
background thread schedules, in every step, a packed row of prompt chunks and decode tokens of many
requests. inferwatch wraps ``init_continuous_batching`` on the instrumented model (an instance attribute,
like ``generate``) and, on each manager it returns, instance attributes at points whose roles are the same
in transformers 5.17 and 5.24 (:data:`SUPPORTED_VERSIONS`):

* ``manager.add_request`` (the caller's thread): the request's arrival (an open
  :class:`~inferwatch.instrumentation.timing.arrival.Arrival`, else the request's own ``created_time``);
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

What the hooks see goes to the model's :class:`~.timeline.BatchTimeline`,
which resolves it. The paged KV cache is read by the background thread
(:class:`~.paged.PagedCacheView`).

Where a version's internals differ, what can still be hooked is: without the request points the steps are
still measured, without the step points the forward hooks time each pass on its own. The reason is logged
once and counted in ``llm_instrumentation_errors_total{stage="batching"}``.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from typing import Any

from inferwatch.instrumentation.batching.batch_timeline import BatchTimeline
from inferwatch.instrumentation.batching.paged import PagedCacheView
from inferwatch.instrumentation.metrics.containment import ErrorReporter
from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.model.wrapping import wrap_method
from inferwatch.instrumentation.timing.arrival import ARRIVAL

logger = logging.getLogger("inferwatch.instrumentation")

#: The transformers releases whose continuous-batching internals these hooks were read against.
SUPPORTED_VERSIONS = ((5, 17), (5, 24))


class BatchingHooks:
    """Attaches a model's :class:`BatchTimeline` to the managers its ``init_continuous_batching`` returns."""

    def __init__(self, model: ModelContext) -> None:
        self._model = model
        self.timeline = BatchTimeline(model)
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._warned: set[str] = set()

    def wrap_init(self, original: Any) -> Any:
        @functools.wraps(original)
        def init_continuous_batching(*args: Any, **kwargs: Any) -> Any:
            manager = original(*args, **kwargs)
            if self._model.active:
                self.attach(manager)
            return manager

        return init_continuous_batching

    def _degrade(self, what: str, exc: BaseException) -> None:
        self._model.errors.report("batching", exc)
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
            wrap_method(manager, "add_request", functools.partial(self._add_request, weakref.ref(manager)))
            errors = timeline.errors
            wrap_method(manager, "cancel_request", _observing(timeline.cancel, errors, before=False))
            router = manager.output_router
            wrap_method(router, "fail_and_deliver", _observing(timeline.fail, errors, before=True))
            wrap_method(router, "deliver", _observing(timeline.deliver_one, errors, before=False))
            wrap_method(router, "deliver_batch", _observing(timeline.deliver, errors, before=False))
        except Exception as exc:
            self._degrade("requests are not followed; steps are", exc)
        try:
            wrap_method(manager, "_create_batch_processor", self._processor_factory)
        except Exception as exc:
            self._degrade("steps are not followed; the forward passes are timed one by one", exc)

    def _add_request(self, manager: weakref.ref, original: Any) -> Any:
        timeline = self.timeline

        def add_request(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            created = time.perf_counter()
            request_id = original(input_ids, *args, **kwargs)
            try:
                if request_id is not None:
                    limit = _max_new_tokens(manager(), args, kwargs)
                    arrival = ARRIVAL.get()
                    first = arrival is not None and not arrival.claimed
                    arrived = arrival.time if first else None
                    edge = first and arrival.ttft_at_first_content
                    timeline.arrive(request_id, arrived, created, len(input_ids), limit, edge)
                    if first:  # after arrive: a client already gone cancels the request at once
                        arrival.claim(timeline.series, _disconnect(manager, request_id, arrival, timeline))
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
        wrap_method(processor.scheduler, "add_waiting_request", requeue)
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

        wrap_method(io, "prepare_batch_tensors", prepare)
        wrap_method(runner, "compute_batch", compute)
        wrap_method(processor, "warmup", warmup)
        wrap_method(processor, "prepare_next_batch", idle)
        if view is not None:
            self._model.series.watch_paged_cache(view)


def _max_new_tokens(manager: Any, args: tuple, kwargs: dict) -> int | None:
    """The ``max_new_tokens`` of an ``add_request(input_ids, request_id, max_new_tokens, ...)`` call: its
    argument, else the manager's generation config, as the manager resolves it."""
    limit = kwargs["max_new_tokens"] if "max_new_tokens" in kwargs else args[1] if len(args) > 1 else None
    if limit is None and manager is not None:
        limit = getattr(getattr(manager, "generation_config", None), "max_new_tokens", None)
    return None if limit is None else int(limit)


def _disconnect(manager: weakref.ref, request_id: str, arrival: Any, timeline: BatchTimeline) -> Any:
    """What ends a request whose client went away: cancelled now, and its generation stopped where the
    middleware was asked to (``stop_generation_on_disconnect``)."""

    def on_disconnect(at: float, undelivered_from: float) -> None:
        timeline.cancel(request_id, undelivered_from)
        held = manager()
        if arrival.stop_on_disconnect and held is not None:
            try:
                held.cancel_request(request_id)
            except Exception as exc:
                timeline.errors.report("batching", exc)

    return on_disconnect


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
