"""``instrument(model)``: hooks on a transformers causal LM's ``forward`` and ``generate``.

* ``forward``: a pre-hook and a post-hook (``register_forward_pre_hook``/``register_forward_hook``) that
  record a clock mark each, read input and KV-cache *shapes*, and attribute the pass to the request
  running in this thread (a context variable set by the generate wrapper or by ``track_request``).
* ``generate``: replaced by an *instance* attribute wrapping the original (the class is never patched),
  which opens a request at entry and closes it at exit. Exceptions from the model propagate unchanged.
* ``_get_stopping_criteria``: wrapped the same way; the criteria generate calls each time it has sampled
  the next tokens come back as :class:`TokenMarkingCriteria`, which records a clock mark there first: a
  token counts as produced when the device has sampled it.
* ``init_continuous_batching``: wrapped the same way; the managers it returns are followed request by
  request and step by step (:mod:`inferwatch.instrumentation.batching`).
* ``get_compiled_call``: wrapped the same way; the ``torch.compile``'d call generate uses for decode steps
  with a static cache is timed from around it, while the forward hooks, traced into that compiled region,
  fold to nothing. Once a request's shapes are settled its steps are a :class:`DecodeRun`: two marks per
  step and nothing else in the hot path (docs/timing.md, "The compiled decode step").

What inferwatch keeps never keeps the model alive: the registry of handles is weak, the handle reaches the
wrappers only weakly, and when the model is collected its live series go with it.

Everything inferwatch does in these paths is inside ``try/except`` and reported to
``llm_instrumentation_errors_total``; the model's own behaviour and outputs are untouched.
"""

from __future__ import annotations

import collections
import copy
import functools
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from inferwatch.instrumentation import catalogue as cat
from inferwatch.instrumentation.arrival import ARRIVAL, Arrival
from inferwatch.instrumentation.batching import BatchingHooks
from inferwatch.instrumentation.busy import NVML_DISABLED, BusyReading
from inferwatch.instrumentation.catalogue import metrics_for
from inferwatch.instrumentation.clock import Clock, Fetched, clock_for
from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.hardware import (
    DeviceIdentity,
    Footprint,
    device_identity,
    model_device,
    model_dtype,
    parameter_footprint,
    table_peak_flops,
)
from inferwatch.instrumentation.kvcache import KVCacheSize, measure, output_cache
from inferwatch.instrumentation.nvml import NvmlPoller
from inferwatch.instrumentation.pollers import CudaAllocatorPoller, ModelPoller
from inferwatch.instrumentation.profiling import CAPTURES
from inferwatch.instrumentation.request import (
    CURRENT_REQUEST,
    RUN_DRAIN_MARKS,
    TIMED_AROUND,
    DecodeRun,
    LooseForward,
    Request,
    Step,
    call_timed_around,
    failure_status,
)
from inferwatch.instrumentation.series import drop_gauge, forget_series, series_for
from inferwatch.instrumentation.tokens import LiveTokens, every_row_generates, generated_count, prompt_of
from inferwatch.instrumentation.worker import NVML_WORKER, SAMPLER
from prometheus_client import CollectorRegistry

MAX_MODEL_LABEL_LENGTH = 128
#: A request's KV cache is measured after its prefill, its first decode step and then every this many
#: steps: the gauge trails the cache by fewer tokens than that.
KV_MEASURE_INTERVAL = 16


def default_model_name(model: torch.nn.Module) -> str:
    """The config's ``_name_or_path`` (a local path shortened to its last component), else its
    ``model_type``, else the class name."""
    config = getattr(model, "config", None)
    name = str(getattr(config, "_name_or_path", "") or "").rstrip("/\\")
    if name and os.path.isabs(name):
        name = os.path.basename(name)
    return name or str(getattr(config, "model_type", "") or type(model).__name__)


def _check_model(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"instrument() needs a torch.nn.Module with generate() (a transformers causal LM), "
            f"got {type(model).__module__}.{type(model).__qualname__}"
        )
    if not callable(getattr(model, "generate", None)):
        raise TypeError(
            f"instrument() needs a transformers causal LM (e.g. from AutoModelForCausalLM), "
            f"but {type(model).__qualname__} has no generate(); for a hand-written decode loop use "
            "track_request()"
        )
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise TypeError(
            f"instrument() supports decoder-only causal LMs; {type(model).__qualname__} is encoder-decoder"
        )


def _input_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A forward's ``input_ids`` (or ``inputs_embeds``): [batch, new tokens, ...]."""
    tokens = kwargs.get("input_ids")
    if tokens is None and args:
        tokens = args[0]
    if isinstance(tokens, torch.Tensor) and tokens.dim() >= 2:
        return tokens
    embeds = kwargs.get("inputs_embeds")
    if isinstance(embeds, torch.Tensor) and embeds.dim() >= 3:
        return embeds
    return None


def _kv_size(output: Any) -> KVCacheSize | None:
    cache = output_cache(output)
    return None if cache is None else measure(cache)


def _kv_bytes(output: Any) -> int:
    size = _kv_size(output)
    return 0 if size is None else size.bytes


@dataclass(frozen=True)
class Placement:
    """Where a model runs and what its weights weigh: everything that changes when it is moved."""

    device: torch.device
    identity: DeviceIdentity  # the labels of its per-device series
    clock: Clock
    dtype: torch.dtype
    footprint: Footprint
    #: (device, dtype) of the first parameter: compared at each generate entry to notice a move.
    fingerprint: tuple[torch.device, torch.dtype] | None

    @property
    def label(self) -> str:
        """The ``device`` label: the key of the model's per-device work windows too."""
        return self.identity.device

    @classmethod
    def of(cls, model: torch.nn.Module) -> Placement:
        device = model_device(model)
        footprint = parameter_footprint(model)
        return cls(
            device,
            device_identity(device),
            clock_for(device),
            model_dtype(model),
            footprint,
            _fingerprint(model),
        )


class ForwardStart(NamedTuple):
    """What the forward pre-hook leaves for the post-hook of the same forward, in this thread."""

    placement: Placement
    batch: int  # sequences in the input
    new_tokens: int  # tokens per sequence the forward consumes (> 1: a prefill)
    mark: Any  # the clock mark recorded before the forward
    host: float  # perf_counter read just before the mark


def _fingerprint(model: torch.nn.Module) -> tuple[torch.device, torch.dtype] | None:
    first = next(model.parameters(), None)
    return None if first is None else (first.device, first.dtype)


class ModelInstrumentation:
    """The hooks of one model. Created and installed by :func:`instrument`."""

    def __init__(self, model: torch.nn.Module, name: str, config: InstrumentConfig, metrics: cat.Metrics):
        self.model_ref = weakref.ref(model)
        self.name = name
        self.model_type = str(
            getattr(getattr(model, "config", None), "model_type", "") or type(model).__name__
        )
        self.config = config
        self.metrics = metrics
        self.errors = metrics.errors
        self.series = series_for(metrics, name)
        self.placement = Placement.of(model)
        self.active = False
        self._local = threading.local()
        self._lock = threading.Lock()
        self._hook_handles: list[torch.utils.hooks.RemovableHandle] = []
        self._hook_ids: tuple[int, int] = (-1, -1)  # (pre-hook, post-hook) ids in the model's hook dicts
        self._hooks_out = 0  # generates running with the forward hooks taken out (_hide_hooks)
        self._hooks_held: tuple[Any, Any] | None = None  # the hooks while they are out
        # Weak: the wrappers (generate, init_continuous_batching) live on the model and hold the original
        # methods (bound to the model); a strong reference from here would keep every instrumented model
        # alive.
        self._wrappers: dict[str, weakref.ref] = {}
        self.batching = BatchingHooks(self)
        self._poller_keys: list[tuple] = []
        self._devices: set[DeviceIdentity] = set()  # every device the model's series were written under

    # -- installation ----------------------------------------------------------------------------------

    def install(self, model: torch.nn.Module) -> None:
        self._hook_handles = [
            model.register_forward_pre_hook(self._forward_pre, with_kwargs=True),
            model.register_forward_hook(self._forward_post, with_kwargs=True),
        ]
        self._hook_ids = (self._hook_handles[0].id, self._hook_handles[1].id)
        self._replace(model, "generate", self._wrap_generate)
        if _token_marking_criteria() is not None and _generates_like_transformers(model):
            self._replace(model, "_get_stopping_criteria", self._wrap_stopping_criteria)
        if hasattr(model, "get_compiled_call"):
            self._replace(model, "get_compiled_call", self._wrap_compiled_call)
        if hasattr(model, "init_continuous_batching"):
            self._replace(model, "init_continuous_batching", self.batching.wrap_init)
        self.metrics.live_models[self.name] = self.metrics.live_models.get(self.name, 0) + 1
        weakref.finalize(model, _GONE.append, self).atexit = False
        _watch_registry(self.metrics)
        self._publish()
        self.active = True

    def _replace(self, model: torch.nn.Module, name: str, wrap: Any) -> None:
        """Put ``wrap(model.name)`` on the instance, remembering an instance attribute it replaces."""
        wrapper = wrap(getattr(model, name))
        wrapper._inferwatch_previous = model.__dict__.get(name)
        self._wrappers[name] = weakref.ref(wrapper)
        setattr(model, name, wrapper)

    def _restore(self, model: torch.nn.Module) -> None:
        for name, ref in self._wrappers.items():
            wrapper = ref()
            if wrapper is not None and model.__dict__.get(name) is wrapper:
                if wrapper._inferwatch_previous is not None:
                    setattr(model, name, wrapper._inferwatch_previous)
                else:
                    delattr(model, name)
        # If someone wrapped a method on top of ours, ours stays in their chain as a pass-through
        # (self.active is False).
        self._wrappers = {}

    def _info_labels(self) -> tuple[str, ...]:
        placement = self.placement
        dtype = str(placement.dtype).removeprefix("torch.")
        return self.name, self.model_type, dtype, *placement.identity.labels, str(placement.footprint.count)

    def _publish(self) -> None:
        """Model info and background pollers for the current placement."""
        self._devices.add(self.placement.identity)
        self.metrics[cat.MODEL_INFO].labels(*self._info_labels()).set(1)
        try:
            self._start_pollers()
        except Exception as exc:  # the hooks work without the background readings
            self.errors.report("instrument", exc)

    def _retire(self) -> None:
        for worker, key in self._poller_keys:
            worker.release(key)
        self._poller_keys = []
        drop_gauge(self.metrics[cat.MODEL_INFO], *self._info_labels())

    def follow(self) -> None:
        """Notice that the model was moved (``model.to("cuda")`` after ``instrument()``, as happens under
        the launcher) or cast, and switch clock, pollers and model info to where it is now."""
        model = self.model_ref()
        if model is None or _fingerprint(model) == self.placement.fingerprint:
            return
        with self._lock:
            if not self.active or _fingerprint(model) == self.placement.fingerprint:
                return
            self._retire()
            self.placement = Placement.of(model)
            self._publish()

    def _start_pollers(self) -> None:
        placement, config = self.placement, self.config
        device, label, interval = placement.device, placement.label, config.poll_interval_seconds
        peak_flops = config.peak_flops
        if peak_flops is None and device.type == "cuda":
            peak_flops = table_peak_flops(torch.cuda.get_device_name(device), placement.dtype)
        nvml = self._start_device_pollers() if device.type == "cuda" else None
        configured = config.peak_memory_bandwidth_bytes_per_second

        def peak_bandwidth() -> float | None:
            # The configured figure, else what the NVML poller of this device read (once, on its thread).
            return configured or (None if nvml is None else nvml.peak_bandwidth)

        def busy() -> BusyReading | None:
            return None if nvml is None else nvml.busy  # written by the NVML poller's thread

        key = ("model", id(self), label)
        identity = placement.identity
        SAMPLER.acquire(
            key,
            lambda: ModelPoller(self.series, device, identity, interval, peak_flops, peak_bandwidth, busy),
        )
        self._poller_keys.append((SAMPLER, key))

    def _start_device_pollers(self) -> NvmlPoller | None:
        """The CUDA allocator's poller and, where enabled, the device's NVML poller (returned)."""
        config, device, label = self.config, self.placement.device, self.placement.label
        identity, interval = self.placement.identity, config.poll_interval_seconds
        key = ("allocator", id(self.metrics), label)
        SAMPLER.acquire(key, lambda: CudaAllocatorPoller(self.metrics, device, identity, interval))
        self._poller_keys.append((SAMPLER, key))
        if not config.enable_nvml:
            self.metrics[cat.GPU_BUSY_UNAVAILABLE].labels(*identity.labels, NVML_DISABLED).set(1)
            return None
        key = ("nvml", id(self.metrics), label)
        index = device.index or 0
        nvml = NVML_WORKER.acquire(key, lambda: NvmlPoller(self.metrics, identity, index, interval))
        self._poller_keys.append((NVML_WORKER, key))
        return nvml

    def remove(self) -> None:
        """Take every hook off the model and stop its pollers; idempotent."""
        with self._lock:
            if not self.active:
                return
            self.active = False
            for handle in self._hook_handles:
                handle.remove()
            self._hook_handles = []
            model = self.model_ref()
            if model is not None:
                self._restore(model)
            self._retire()

    def forget(self) -> None:
        """The model was garbage-collected: stop its pollers, and drop its live series once no model of
        its name is left on the registry."""
        try:
            self.remove()
            metrics, name = self.metrics, self.name
            with _instrumented_lock:
                left = metrics.live_models.get(name, 1) - 1
                if left > 0:
                    metrics.live_models[name] = left
                    return
                metrics.live_models.pop(name, None)
                forget_series(metrics, name, [device.labels for device in self._devices])
        except Exception as exc:  # runs from the garbage collector: nothing may escape
            self.errors.report("collect", exc)

    # -- forward hooks ---------------------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module | None, args: tuple, kwargs: dict) -> None:
        # Traced by torch.compile around the module's __call__ where it is compiled with the hooks in (the
        # user's own torch.compile, or generate's with hooks of the user's on the model: _hide_hooks): the
        # check folds to a constant, so the hook adds nothing to the graph and breaks nothing.
        if torch.compiler.is_compiling() or not self.active or TIMED_AROUND.get():
            return
        request = CURRENT_REQUEST.get()
        if request is not None and request.decode_run is not None:  # timed from around the compiled call
            return  # (the post-hook finds no start and returns too)
        try:
            placement = self.placement
            tensor = _input_tensor(args, kwargs)
            if CAPTURES.armed:  # an on-demand profile (profiling.py): one attribute read otherwise
                CAPTURES.boundary(tensor is not None and tensor.shape[1] > 1)
            if tensor is not None and tensor.device != placement.device:
                self.follow()
                placement = self.placement
            shape = (0, 0) if tensor is None else (tensor.shape[0], tensor.shape[1])
            start_host = time.perf_counter()  # read before the mark: no mark completes before this
            self._local.start = ForwardStart(
                placement, shape[0], shape[1], placement.clock.mark(), start_host
            )
        except Exception as exc:
            self.errors.report("forward_pre", exc)

    def _forward_post(self, module: torch.nn.Module | None, args: tuple, kwargs: dict, output: Any) -> None:
        if torch.compiler.is_compiling() or not self.active or TIMED_AROUND.get():
            return
        try:
            started = self._local.__dict__.pop("start", None)
            series = self.series
            series.heartbeat()
            if started is None:  # installed while this forward was running
                return
            placement, batch, new_tokens = started.placement, started.batch, started.new_tokens
            start, start_host = started.mark, started.host
            clock = placement.clock
            request = CURRENT_REQUEST.get()
            if request is not None and request.clock is not clock:
                request = None  # a tracked request on another clock: time the forward on its own
            if request is None:
                phase = "prefill" if new_tokens > 1 else "decode"
                kv_bytes = _kv_bytes(output) if phase == "decode" else 0
            else:
                phase = "prefill" if request.forwards == 0 else "decode"
                # Reading every layer's shapes costs microseconds per step on deep models: measure after
                # the prefill, the first decode step, then every KV_MEASURE_INTERVAL steps.
                # A preallocated (static) cache keeps its size: measured once.
                forwards = request.forwards
                if forwards < 2 or (forwards % KV_MEASURE_INTERVAL == 0 and not request.kv_static):
                    request.set_kv(_kv_size(output))
                kv_bytes = request.kv_bytes
            if phase == "decode":
                work = placement.footprint.decode_read_bytes + kv_bytes  # weights and the whole cache
            else:
                work = 2.0 * placement.footprint.matmul_count * batch * new_tokens  # FLOPs of the prompt
            # With sampled-token marks the criterion counts the tokens; else the forward's end does.
            tokens = 1 if request is not None and request.owner is self and not request.marks_sampling else 0
            if request is not None:
                request.drain_batch()  # earlier steps, complete since generate's last synchronization
            # The end mark comes last: in a launch-bound step the device reaches it as soon as it is
            # recorded, so the hook's own bookkeeping before it counts as part of the step (the caller
            # waits for it too) instead of widening the gap to whoever reads the clock next.
            end_host = time.perf_counter()
            end = clock.mark()
            step = Step(
                series=series,
                device=placement.label,
                phase=phase,
                start=start,
                end=end,
                tokens=tokens,
                work=work,
                start_host=start_host,
                end_host=end_host,
                batch=batch,
                processed=batch * new_tokens,
            )
            if request is None:
                loose = LooseForward(clock, step)
                if not loose.complete():
                    SAMPLER.defer(loose, self.errors)
            else:
                request.add(step)
        except Exception as exc:
            self.errors.report("forward_post", exc)

    # -- generate --------------------------------------------------------------------------------------

    def _wrap_generate(self, original: Any) -> Any:
        @functools.wraps(original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            entry = time.perf_counter()
            if not self.active:
                return original(*args, **kwargs)
            current = CURRENT_REQUEST.get()
            if current is not None and current.owner is self:  # generate re-entered from inside itself
                return original(*args, **kwargs)
            request = self._begin(entry, args, kwargs)
            if request is None:
                return original(*args, **kwargs)
            token = CURRENT_REQUEST.set(request)
            try:
                output = original(*args, **kwargs)
            except BaseException as exc:
                if CAPTURES.armed:
                    CAPTURES.generate_ended()
                CURRENT_REQUEST.reset(token)
                if request.hooks_hidden:
                    self._show_hooks(self.model_ref())
                self._fail(request, exc)
                raise
            if CAPTURES.armed:
                CAPTURES.generate_ended()
            CURRENT_REQUEST.reset(token)
            if request.hooks_hidden:
                self._show_hooks(self.model_ref())
            self._succeed(request, kwargs, output)
            return output

        return generate

    def _wrap_compiled_call(self, original: Any) -> Any:
        """``get_compiled_call``, through which generate gets the ``torch.compile``'d forward of its decode
        steps (static caches): the compiled call comes back wrapped, so each step is timed from around the
        compiled region, never from inside it (no graph break, no recompilation when hooks come or go)."""

        @functools.wraps(original)
        def get_compiled_call(*args: Any, **kwargs: Any) -> Any:
            compiled = original(*args, **kwargs)
            return self._timed_around(compiled) if self.active else compiled

        return get_compiled_call

    def _timed_around(self, compiled: Any) -> Any:
        # A closure per generate: kept by nobody once generate returns (it holds the model, as
        # ``compiled`` does).
        model = self.model_ref()

        def compiled_forward(*args: Any, **kwargs: Any) -> Any:
            request = CURRENT_REQUEST.get()
            run = None if request is None else request.decode_run
            if run is None or not self.active:
                if request is not None and request.owner is self and not request.hooks_hidden:
                    request.hooks_hidden = self._hide_hooks(model)
                run = self._start_run(request, args, kwargs)
            if run is None:
                self._forward_pre(None, args, kwargs)
                output = call_timed_around(compiled, args, kwargs)
                self._forward_post(None, args, kwargs, output)
                return output
            # The hot path of a settled decode step: a mark before, a mark after, nothing else. The forward
            # hooks stand aside for a request with a run (should they be in, see _hide_hooks).
            if CAPTURES.armed:
                CAPTURES.boundary(False)
            mark = run.mark
            try:
                start = mark()
            except Exception as exc:
                self.errors.report("forward_pre", exc)
                return compiled(*args, **kwargs)
            output = compiled(*args, **kwargs)
            try:
                end = mark()
                marks = run.marks
                marks.append(start)
                marks.append(end)
                if len(marks) >= RUN_DRAIN_MARKS:
                    request.drain()  # earlier steps, complete since generate's last synchronization
            except Exception as exc:
                self.errors.report("forward_post", exc)
            return output

        return compiled_forward

    def _hide_hooks(self, model: torch.nn.Module) -> bool:
        """Take this model's forward hooks out of its hook dicts, where they are its only ones, until
        :meth:`_show_hooks` (at the exit of the generate that calls the compiled step); True if they are
        out (or already were, for another generate).

        A module with forward hooks runs them through ``Module._call_impl``'s slow path, which the compiled
        call captures and replays every step: 25 µs per step on the CPU, even with hooks that trace to
        nothing (docs/benchmarks.md). Without them the call is exactly the one a bare model compiles, so
        instrument() and remove() never make dynamo compile again. Meanwhile another thread's forward of
        the same model is not timed; with hooks of the user's on the model, ours stay in and stand aside
        (TIMED_AROUND, DecodeRun)."""
        try:
            with self._lock:  # remove() takes it too: a hook it removed is never put back
                if not self.active:
                    return False
                if self._hooks_out == 0:
                    pre_hooks, post_hooks = model._forward_pre_hooks, model._forward_hooks
                    pre_id, post_id = self._hook_ids
                    if len(pre_hooks) != 1 or len(post_hooks) != 1 or pre_id not in pre_hooks:
                        return False
                    self._hooks_held = (pre_hooks.pop(pre_id), post_hooks.pop(post_id))
                self._hooks_out += 1
                return True
        except Exception as exc:
            self.errors.report("forward_pre", exc)
            return False

    def _show_hooks(self, model: torch.nn.Module | None) -> None:
        """Put the forward hooks back once the last generate that took them out has ended."""
        try:
            with self._lock:
                self._hooks_out -= 1
                if self._hooks_out or self._hooks_held is None:
                    return
                (pre_hook, post_hook), self._hooks_held = self._hooks_held, None
                if self.active and model is not None:
                    pre_id, post_id = self._hook_ids
                    model._forward_pre_hooks[pre_id] = pre_hook
                    model._forward_hooks[post_id] = post_hook
        except Exception as exc:
            self.errors.report("generate_exit", exc)

    def _start_run(self, request: Request | None, args: tuple, kwargs: dict) -> DecodeRun | None:
        """The request's :class:`DecodeRun`, begun now if its decode steps are settled: its third forward
        or later, one new token per sequence, a preallocated cache already measured. None: the forward
        hooks time this step."""
        if (
            request is None
            or request.owner is not self
            or request.forwards < 2
            or not request.kv_static
            or not self.active
        ):
            return None
        try:
            placement = self.placement
            tensor = _input_tensor(args, kwargs)
            if request.clock is not placement.clock or tensor is None or tensor.shape[1] != 1:
                return None
            work = placement.footprint.decode_read_bytes + request.kv_bytes
            run = request.decode_run = DecodeRun(request.clock, placement.label, tensor.shape[0], work)
            return run
        except Exception as exc:
            self.errors.report("forward_pre", exc)
            return None

    def _wrap_stopping_criteria(self, original: Any) -> Any:
        """``_get_stopping_criteria``, through which generate builds the stopping criteria of its loop:
        for a request of this model they come back as :class:`TokenMarkingCriteria`."""

        @functools.wraps(original)
        def get_stopping_criteria(*args: Any, **kwargs: Any) -> Any:
            criteria = original(*args, **kwargs)
            request = CURRENT_REQUEST.get()
            if not self.active or request is None or request.owner is not self or request.marks_sampling:
                return criteria
            try:
                marking = _token_marking_criteria()
                if not isinstance(criteria, marking.__bases__[0]):  # not transformers' list: left alone
                    return criteria
                criteria = marking(criteria, self, request)
                request.marks_sampling = True
            except Exception as exc:
                self.errors.report("generate_enter", exc)
            return criteria

        return get_stopping_criteria

    def _begin(self, entry: float, args: tuple, kwargs: dict) -> Request | None:
        try:
            self.follow()
            arrival = ARRIVAL.get()
            arrived = None if arrival is None else arrival.claim()
            clock = self.placement.clock
            prompt = prompt_of(args, kwargs)
            live = LiveTokens(
                None if prompt is None else prompt.count(clock),
                1 if prompt is None else prompt.rows,
                every_row_generates(kwargs, self._generation_config(kwargs)),
            )
            request = Request(self.series, clock, owner=self, live=live, entry=entry, arrival=arrived)
            request.prompt_length = 0 if prompt is None else prompt.length
            return request
        except Exception as exc:
            self.errors.report("generate_enter", exc)
            return None

    def _fail(self, request: Request, exc: BaseException) -> None:
        try:
            status = failure_status(exc)
            if status == "oom":
                self.series.oom_events.inc()
            request.finish(status)
            if not request.complete():
                SAMPLER.defer(request, self.errors)
        except Exception as error:
            self.errors.report("generate_exit", error)

    def _succeed(self, request: Request, kwargs: dict, output: Any) -> None:
        try:
            counts = self._token_counts(request, kwargs, output)
        except Exception as exc:
            self.errors.report("generate_exit", exc)
            counts = None  # the request is still finished and timed, its tokens go uncounted
        try:
            request.finish("ok", counts)
            if not request.complete():
                SAMPLER.defer(request, self.errors)
        except Exception as exc:
            self.errors.report("generate_exit", exc)

    def _generation_config(self, kwargs: dict) -> Any:
        """The generation config a generate call runs with: its argument's, else the model's."""
        generation_config = kwargs.get("generation_config")
        if generation_config is None:
            generation_config = getattr(self.model_ref(), "generation_config", None)
        return generation_config

    def _token_counts(self, request: Request, kwargs: dict, output: Any) -> Fetched | None:
        """The tokens a finished generate generated, computed on the output's device and copied to the
        host asynchronously (see docs/timing.md, "Token counts")."""
        generation_config = self._generation_config(kwargs)
        counts = generated_count(output, request.prompt_length, generation_config, kwargs)
        return None if counts is None else self.placement.clock.fetch(counts)


def _generates_like_transformers(model: torch.nn.Module) -> bool:
    """Whether ``model.generate`` is transformers' (whose loop calls ``_get_stopping_criteria``'s list)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:
        return False
    return isinstance(model, GenerationMixin) and callable(getattr(model, "_get_stopping_criteria", None))


@functools.cache
def _token_marking_criteria() -> type | None:
    """:class:`TokenMarkingCriteria`, made on first use (transformers is imported only where it is used);
    None without transformers."""
    try:
        from transformers.generation.stopping_criteria import StoppingCriteriaList
    except ImportError:
        return None

    class TokenMarkingCriteria(StoppingCriteriaList):
        """generate's own stopping criteria, which it calls each time it has sampled the next tokens: a
        clock mark is recorded there first, so TTFT and token times end at the sampled token (after logits
        processing and sampling), not at the end of the forward.

        No criterion is added to the list: transformers ORs every criterion's answer into the result, a
        device op per step (9.5 µs of host time on the H200 machine, host_costs.py). The list holds the
        request, never the model; a deep copy of it is transformers' plain list."""

        def __init__(self, criteria: list, instrumentation: ModelInstrumentation, request: Request) -> None:
            super().__init__(criteria)
            self._instrumentation = instrumentation
            self._request = request

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            request = self._request
            if request.decode_run is None:
                try:
                    request.mark_tokens(self._instrumentation.placement.label, 1)
                except Exception as exc:
                    self._instrumentation.errors.report("token_mark", exc)
            else:
                # A compiled run places its tokens at its steps' end marks: from now on this is
                # transformers' own list again, with no frame of inferwatch's left in the step.
                try:
                    self.__class__ = StoppingCriteriaList
                except TypeError as exc:
                    self._instrumentation.errors.report("token_mark", exc)
            return StoppingCriteriaList.__call__(self, input_ids, scores, **kwargs)

        def __deepcopy__(self, memo: dict) -> StoppingCriteriaList:
            return StoppingCriteriaList(copy.deepcopy(list(self), memo))

    return TokenMarkingCriteria


class InstrumentationHandle:
    """What :func:`instrument` returns: metadata about the instrumentation and the way to remove it."""

    def __init__(self, instrumentation: ModelInstrumentation, registry: CollectorRegistry | None) -> None:
        self._instrumentation = instrumentation
        self.registry = registry
        self.model_name = instrumentation.name
        self.config = instrumentation.config

    @property
    def active(self) -> bool:
        """True until :meth:`remove`."""
        return self._instrumentation.active

    @property
    def device(self) -> torch.device:
        """Where the model ran at its last generate (instrumentation follows ``model.to(...)``)."""
        return self._instrumentation.placement.device

    def count_waiting(self, arrival: Arrival) -> None:
        """Count a server request that will run on this model in ``llm_requests_waiting`` from now until
        its generate starts (servers that queue requests before calling generate)."""
        arrival.wait_on(self._instrumentation.series.waiting)

    def remove(self) -> None:
        """Remove every hook and wrapper from the model; idempotent. Metrics already recorded stay."""
        with _instrumented_lock:
            self._instrumentation.remove()
            model = self._instrumentation.model_ref()
            if model is not None and _instrumented.get(model) is self:
                del _instrumented[model]

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until observations deferred to the background (requests whose device work was still in
        flight at exit) are made; False if some are still pending after ``timeout`` seconds."""
        return SAMPLER.flush(timeout)

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"<InstrumentationHandle model={self.model_name!r} device={self.device} {state}>"


#: Instrumentations whose model was collected. The finalizer only appends here: it runs inside the garbage
#: collector, in whatever thread allocated, possibly while that thread holds one of inferwatch's locks;
#: the series are dropped at the next scrape or instrument() instead.
_GONE: collections.deque[ModelInstrumentation] = collections.deque()


def forget_collected_models() -> None:
    """Drop the live series and pollers of instrumented models that were garbage-collected."""
    while True:
        try:
            instrumentation = _GONE.popleft()
        except IndexError:
            return
        instrumentation.forget()


def _watch_registry(metrics: cat.Metrics) -> None:
    """Have every scrape of the registry forget collected models first."""
    with _watch_lock:
        if forget_collected_models not in metrics.before_scrape:
            metrics.before_scrape.append(forget_collected_models)


_watch_lock = threading.Lock()
_instrumented: weakref.WeakKeyDictionary[torch.nn.Module, InstrumentationHandle] = weakref.WeakKeyDictionary()
_instrumented_lock = threading.Lock()


def instrument(
    model: torch.nn.Module,
    *,
    model_name: str | None = None,
    config: InstrumentConfig | None = None,
    registry: CollectorRegistry | None = None,
) -> InstrumentationHandle:
    """Instrument a transformers causal LM: hooks on ``forward`` and ``generate`` feed the ``llm_*``
    metrics of docs/metrics.md on ``registry`` (default: prometheus_client's REGISTRY).

    ``model_name`` is the ``model`` label (default: the config's ``_name_or_path`` or ``model_type``).
    Calling it again on an instrumented model returns the same live handle. Raises ``TypeError`` for an
    object that is not a causal LM and ``ValueError`` for a bad configuration.
    """
    _check_model(model)
    forget_collected_models()
    if config is None:
        config = InstrumentConfig()
    elif not isinstance(config, InstrumentConfig):
        raise TypeError(f"config must be an InstrumentConfig, got {type(config).__name__}")
    if model_name is None:
        model_name = default_model_name(model)
    if not isinstance(model_name, str) or not model_name.strip():
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    if len(model_name) > MAX_MODEL_LABEL_LENGTH:
        raise ValueError(f"model_name must be at most {MAX_MODEL_LABEL_LENGTH} characters: {model_name!r}")
    with _instrumented_lock:
        handle = _instrumented.get(model)
        if handle is not None and handle.active:
            return handle
        metrics = metrics_for(registry, config)
        instrumentation = ModelInstrumentation(model, model_name, config, metrics)
        instrumentation.install(model)
        handle = InstrumentationHandle(instrumentation, registry)
        _instrumented[model] = handle
        return handle
