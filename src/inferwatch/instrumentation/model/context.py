"""One instrumented model as every part of its instrumentation sees it: its name and series, where it runs
now, its background lane and pollers, its capture switch, and whether it is instrumented at all.

Everything a hook needs beyond its arguments comes from this object, given to it at installation
(:mod:`inferwatch.instrumentation.instrumenting` builds it): no hook reaches a process-wide object.

The parts (forward hooks, the generate wrapper, the compiled path, the stopping criteria, continuous
batching) each get this one object and nothing of each other;
:mod:`inferwatch.instrumentation.instrumenting` puts them together.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.device.busy import BusyReading
from inferwatch.instrumentation.device.hardware import (
    DeviceIdentity,
    Footprint,
    device_identity,
    model_device,
    model_dtype,
    parameter_footprint,
    table_peak_flops,
)
from inferwatch.instrumentation.device.nvml_poller import NvmlPoller
from inferwatch.instrumentation.device.pollers import CudaAllocatorPoller, ModelPoller
from inferwatch.instrumentation.device.worker import Lane, Worker
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.model_series import drop_gauge, series_for
from inferwatch.instrumentation.metrics.vocabulary import NVML_DISABLED
from inferwatch.instrumentation.timing.clock import Clock, clock_for


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
            fingerprint(model),
        )


def fingerprint(model: torch.nn.Module) -> tuple[torch.device, torch.dtype] | None:
    """Device and dtype of the model's first parameter."""
    first = next(model.parameters(), None)
    return None if first is None else (first.device, first.dtype)


class CaptureSwitch(Protocol):
    """What the hooks see of on-demand profiling (inferwatch.instrumentation.profiling.captures.Captures):
    one attribute read while no capture is armed."""

    armed: bool

    def boundary(self, prefill: bool) -> None: ...

    def generate_ended(self) -> None: ...


class ModelContext:
    """A model under instrumentation: held weakly (inferwatch never keeps it alive)."""

    def __init__(
        self,
        model: torch.nn.Module,
        name: str,
        config: InstrumentConfig,
        metrics: cat.Metrics,
        *,
        background: Lane,
        nvml_worker: Worker,
        captures: CaptureSwitch,
    ):
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
        #: True from installation until removal: every hook and wrapper passes through while False.
        self.active = False
        #: Guards activation, placement and the forward hooks' presence on the model.
        self.lock = threading.Lock()
        self._poller_keys: list[tuple] = []
        self.devices: set[DeviceIdentity] = set()  # every device the model's series were written under
        #: Where the model's requests, forwards and batch steps resolve what the device had not finished,
        #: and whose worker polls its placement.
        self.background = background
        self._nvml_worker = nvml_worker
        #: On-demand profiles: the forward and generate hooks mark step boundaries while one is armed.
        self.captures = captures
        #: Set while this model's forward is timed from around it (a continuous-batching step, generate's
        #: compiled call): its forward hooks then stand aside, so one pass is never timed twice.
        self.timed_around: contextvars.ContextVar[bool] = contextvars.ContextVar(
            f"inferwatch_timed_around_{id(self):x}", default=False
        )

    def call_timed_around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``call(*args, **kwargs)`` with :attr:`timed_around` set for its duration."""
        token = self.timed_around.set(True)
        try:
            return call(*args, **kwargs)
        finally:
            self.timed_around.reset(token)

    def _info_labels(self) -> tuple[str, ...]:
        placement = self.placement
        dtype = str(placement.dtype).removeprefix("torch.")
        return self.name, self.model_type, dtype, *placement.identity.labels, str(placement.footprint.count)

    def publish(self) -> None:
        """Model info and background pollers for the current placement."""
        self.devices.add(self.placement.identity)
        self.metrics[cat.MODEL_INFO].labels(*self._info_labels()).set(1)
        try:
            self._start_pollers()
        except Exception as exc:  # the hooks work without the background readings
            self.errors.report("instrument", exc)

    def unpublish(self) -> None:
        """Stop the current placement's pollers and take its model info down."""
        for worker, key in self._poller_keys:
            worker.release(key)
        self._poller_keys = []
        drop_gauge(self.metrics[cat.MODEL_INFO], *self._info_labels())

    def follow(self) -> None:
        """Notice that the model was moved (``model.to("cuda")`` after ``instrument()``, as happens under
        the launcher) or cast, and switch clock, pollers and model info to where it is now."""
        model = self.model_ref()
        if model is None or fingerprint(model) == self.placement.fingerprint:
            return
        with self.lock:
            if not self.active or fingerprint(model) == self.placement.fingerprint:
                return
            self.unpublish()
            self.placement = Placement.of(model)
            self.publish()

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
        worker = self.background.worker
        worker.acquire(
            key,
            lambda: ModelPoller(self.series, device, identity, interval, peak_flops, peak_bandwidth, busy),
        )
        self._poller_keys.append((worker, key))

    def _start_device_pollers(self) -> NvmlPoller | None:
        """The CUDA allocator's poller and, where enabled, the device's NVML poller (returned)."""
        config, device, label = self.config, self.placement.device, self.placement.label
        identity, interval = self.placement.identity, config.poll_interval_seconds
        key = ("allocator", id(self.metrics), label)
        worker = self.background.worker
        worker.acquire(key, lambda: CudaAllocatorPoller(self.metrics, device, identity, interval))
        self._poller_keys.append((worker, key))
        if not config.enable_nvml:
            self.metrics[cat.GPU_BUSY_UNAVAILABLE].labels(*identity.labels, NVML_DISABLED).set(1)
            return None
        key = ("nvml", id(self.metrics), label)
        index = device.index or 0
        nvml = self._nvml_worker.acquire(key, lambda: NvmlPoller(self.metrics, identity, index, interval))
        self._poller_keys.append((self._nvml_worker, key))
        return nvml
