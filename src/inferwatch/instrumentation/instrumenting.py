"""``instrument(model)``: the parts that hook a transformers causal LM, put together and taken apart.

* ``forward``: a pre-hook and a post-hook (:mod:`.model.forward`);
* ``generate``: an instance attribute wrapping the original (:mod:`.model.generate`);
* ``_get_stopping_criteria``: the criteria generate calls after sampling mark each token
  (:mod:`.model.criteria`);
* ``get_compiled_call``: generate's compiled decode step, timed from around it (:mod:`.model.compiled`);
* ``_get_candidate_generator``: assisted generation's rounds, their draft and accepted tokens
  (:mod:`.model.speculative`);
* ``init_continuous_batching``: the managers it returns, followed request by request and step by step
  (:mod:`inferwatch.instrumentation.batching.manager.manager`).

Each part gets the one :class:`~.model.context.ModelContext` and nothing of the others; this module is
where the process's workers and capture switch are handed to it. What inferwatch keeps never keeps the
model alive: the registry of handles is weak, the handle reaches the wrappers only weakly, and when the
model is collected its live series go with it (within :data:`COLLECTED_POLL_SECONDS`, on the background
thread: the garbage collector's callback only queues it).

Everything inferwatch does in these paths is inside ``try/except`` and reported to
``llm_instrumentation_errors_total``; the model's own behaviour and outputs are untouched.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import threading
import weakref
from typing import Any

import torch
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.batching.manager import BatchingHooks
from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.device.worker import BACKGROUND, NVML_WORKER
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import forget_series
from inferwatch.instrumentation.model.compiled import CompiledPath
from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.model.criteria import (
    generates_like_transformers,
    token_marking_criteria,
    wrap_stopping_criteria,
)
from inferwatch.instrumentation.model.forward import ForwardHooks
from inferwatch.instrumentation.model.generate import GenerateWrapper
from inferwatch.instrumentation.model.speculative import wrap_candidate_generator
from inferwatch.instrumentation.model.wrapping import unwrap_method, wrap_method
from inferwatch.instrumentation.profiling.captures import CAPTURES
from inferwatch.instrumentation.timing.arrival import Arrival

MAX_MODEL_LABEL_LENGTH = 128
#: How often the background thread drops the series of models the garbage collector took.
COLLECTED_POLL_SECONDS = 0.5


def name_or_path_label(name_or_path: str) -> str:
    """The ``model`` label of a model loaded from ``name_or_path``: a hub id as it is, a local path
    shortened to its last component ("" for none)."""
    name = name_or_path.rstrip("/\\")
    return os.path.basename(name) if name and os.path.isabs(name) else name


def default_model_name(model: torch.nn.Module) -> str:
    """The config's ``_name_or_path`` (:func:`name_or_path_label`), else its ``model_type``, else the
    class name."""
    config = getattr(model, "config", None)
    name = name_or_path_label(str(getattr(config, "_name_or_path", "") or ""))
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


class ModelHooks:
    """The instrumentation of one model: its parts, installed on it and removed from it. Created and
    installed by :func:`instrument`."""

    def __init__(self, module: torch.nn.Module, name: str, config: InstrumentConfig, metrics: cat.Metrics):
        self.model = ModelContext(
            module,
            name,
            config,
            metrics,
            background=BACKGROUND.lane(),
            nvml_worker=NVML_WORKER,
            captures=CAPTURES,
        )
        self.forward_hooks = ForwardHooks(self.model)
        self.compiled = CompiledPath(self.model, self.forward_hooks)
        self.generate = GenerateWrapper(self.model, self.compiled)
        self.batching = BatchingHooks(self.model)
        # Weak: the wrappers live on the model and hold the original methods (bound to the model); a
        # strong reference from here would keep every instrumented model alive.
        self._wrappers: dict[str, weakref.ref] = {}

    def install(self, module: torch.nn.Module) -> None:
        model = self.model
        self.forward_hooks.install(module)
        self._wrap(module, "generate", self.generate.wrap)
        if token_marking_criteria() is not None and generates_like_transformers(module):
            self._wrap(module, "_get_stopping_criteria", functools.partial(wrap_stopping_criteria, model))
        if callable(getattr(module, "_get_candidate_generator", None)):
            self._wrap(module, "_get_candidate_generator", functools.partial(wrap_candidate_generator, model))
        if hasattr(module, "get_compiled_call"):
            self._wrap(module, "get_compiled_call", self.compiled.wrap)
        if hasattr(module, "init_continuous_batching"):
            self._wrap(module, "init_continuous_batching", self.batching.wrap_init)
        metrics = model.metrics
        with metrics.lock:
            metrics.live_models[model.name] = metrics.live_models.get(model.name, 0) + 1
        weakref.finalize(module, _GONE.append, self).atexit = False
        BACKGROUND.acquire(CollectedModels.KEY, CollectedModels)
        model.publish()
        model.active = True

    def _wrap(self, module: torch.nn.Module, name: str, make: Any) -> None:
        wrapper = wrap_method(module, name, make)
        if wrapper is not None:
            self._wrappers[name] = weakref.ref(wrapper)

    def remove(self) -> None:
        """Take every hook and wrapper off the model and stop its pollers; idempotent."""
        model = self.model
        with model.lock:
            if not model.active:
                return
            model.active = False
            self.forward_hooks.remove()
            module = model.model_ref()
            if module is not None:
                for name, ref in self._wrappers.items():
                    wrapper = ref()
                    if wrapper is not None:
                        unwrap_method(module, name, wrapper)
            # If someone wrapped a method on top of ours, ours stays in their chain as a pass-through
            # (model.active is False).
            self._wrappers = {}
            model.unpublish()

    def forget(self) -> None:
        """The model was garbage-collected: remove the instrumentation, and drop its live series once no
        model of its name is left on the registry."""
        model = self.model
        try:
            self.remove()
            metrics, name = model.metrics, model.name
            with _instrumented_lock:
                with metrics.lock:
                    left = metrics.live_models.get(name, 1) - 1
                    if left > 0:
                        metrics.live_models[name] = left
                        return
                    metrics.live_models.pop(name, None)
                forget_series(metrics, name, [device.labels for device in model.devices])
        except Exception as exc:  # runs from the garbage collector: nothing may escape
            model.errors.report("collect", exc)


class InstrumentationHandle:
    """What :func:`instrument` returns: metadata about the instrumentation and the way to remove it."""

    def __init__(self, instrumentation: ModelHooks, registry: CollectorRegistry | None) -> None:
        self._instrumentation = instrumentation
        self.registry = registry
        self.model_name = instrumentation.model.name
        self.config = instrumentation.model.config

    @property
    def active(self) -> bool:
        """True until :meth:`remove`."""
        return self._instrumentation.model.active

    @property
    def device(self) -> torch.device:
        """Where the model ran at its last generate (instrumentation follows ``model.to(...)``)."""
        return self._instrumentation.model.placement.device

    def count_waiting(self, arrival: Arrival) -> None:
        """Count a server request that will run on this model in ``llm_requests_waiting`` from now until
        its generate starts (servers that queue requests before calling generate)."""
        arrival.wait_on(self._instrumentation.model.series.waiting)

    def remove(self) -> None:
        """Remove every hook and wrapper from the model; idempotent. Metrics already recorded stay."""
        with _instrumented_lock:
            self._instrumentation.remove()
            model = self._instrumentation.model.model_ref()
            if model is not None and _instrumented.get(model) is self:
                del _instrumented[model]

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until this model's observations deferred to the background (requests whose device work
        was still in flight at exit) are made; False if some are still pending after ``timeout`` seconds.
        Other models' pending work is not waited for."""
        return self._instrumentation.model.background.flush(timeout)

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"<InstrumentationHandle model={self.model_name!r} device={self.device} {state}>"


#: Instrumentations whose model was collected. The finalizer only appends here: it runs inside the garbage
#: collector, in whatever thread allocated, possibly while that thread holds one of inferwatch's locks;
#: the series are dropped on the background thread (:class:`CollectedModels`) or at the next instrument().
_GONE: collections.deque[ModelHooks] = collections.deque()


def forget_collected_models() -> int:
    """Drop the live series and pollers of instrumented models that were garbage-collected; how many."""
    for forgotten in itertools.count():
        try:
            instrumentation = _GONE.popleft()
        except IndexError:
            return forgotten
        instrumentation.forget()
        BACKGROUND.release(CollectedModels.KEY)
    raise AssertionError("unreachable")


class CollectedModels:
    """A background poller, held once per installed model (released when it is forgotten): forgets the
    models the garbage collector took."""

    KEY = ("collected models",)
    interval = COLLECTED_POLL_SECONDS

    def poll(self) -> None:
        forget_collected_models()


#: Serializes instrument() and forgetting a collected model (a model of the name being forgotten is not
#: installed halfway), and guards :data:`_instrumented`.
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
        instrumentation = ModelHooks(model, model_name, config, metrics)
        instrumentation.install(model)
        handle = InstrumentationHandle(instrumentation, registry)
        _instrumented[model] = handle
        return handle
