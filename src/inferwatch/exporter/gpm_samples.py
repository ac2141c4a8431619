"""GPM sample buffers: the NVML calls of GPM (GPU Performance Monitoring, Hopper and newer), and the
buffers they read into, kept per GPU from one collection to the next.

NVML allocates the buffers; each GPU (and each of its GPU instances under MIG) keeps two in its
:class:`GpmState` for the life of its session, and gives them back when the session closes
(:meth:`~.nvml.GpuDevice.release`) or when a GPU instance disappears (:meth:`GpmState.release`). The
calls follow :class:`~.nvml.GpuContext`'s error policy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .nvml import ERROR_FUNCTION_NOT_FOUND, NAN, SUCCESS, GpuContext

log = logging.getLogger(__name__)

# NVML needs the two GPM samples of a metric more than 100 ms apart ("due to the internal sample refresh
# rate", nvmlGpmMetricsGet's documentation): on an H200, samples 20 ms apart gave 0 or NaN for everything.
GPM_MIN_SECONDS = 0.1
# NVML_GPM_METRICS_GET_VERSION: part of the C ABI, like the return codes.
_GPM_METRICS_GET_VERSION = 1


@dataclass(eq=False)
class GpmBuffers:
    """The two GPM sample buffers of one GPU or GPU instance: the sample that opened the current window,
    and a spare that the sample closing it is read into. They swap roles at every closed window, so a GPU
    holds two buffers for the life of its session however long it runs."""

    opened: Any
    spare: Any
    opened_at: float | None = None  # monotonic time of the opening sample; None until one was read
    collection: int = 0  # the device's collection that last used them: a gap means the window is broken
    values: dict[int, float] = field(default_factory=dict)  # metric id -> value of the last closed window

    def close_window(self, at: float, values: dict[int, float]) -> None:
        """The spare now holds the sample that closed the window at ``at``: it opens the next one."""
        self.opened, self.spare = self.spare, self.opened
        self.opened_at, self.values = at, values


@dataclass(eq=False)
class GpmState:
    """One GPU's GPM buffers, by GPU instance (None: the whole GPU)."""

    buffers: dict[int | None, GpmBuffers] = field(default_factory=dict)

    def release(self, nvml: ModuleType, gpu: int, instances: Iterable[int | None] | None = None) -> None:
        """Give NVML back the buffers of ``instances`` (None: of the GPU and every instance).

        Must run while NVML is initialised and while no collection of this GPU runs (the buffers are in
        use during one). A free that fails is logged: nothing else can be done about it.
        """
        for key in list(self.buffers if instances is None else instances):
            buffers = self.buffers.pop(key, None)
            for handle in (buffers.opened, buffers.spare) if buffers else ():
                try:
                    nvml.nvmlGpmSampleFree(handle)
                except (nvml.NVMLError, AttributeError) as exc:
                    log.debug("GPU %d: nvmlGpmSampleFree failed: %s", gpu, exc)


def gpm_buffers(gpu: GpuContext, instance: int | None) -> GpmBuffers | None:
    """The GPM buffers of the GPU (``instance`` None) or of one of its GPU instances, allocated by NVML on
    first use and kept in its :class:`GpmState`; None when NVML could not allocate them."""
    state = gpu.device.state(GpmState)
    buffers = state.buffers.get(instance)
    if buffers is not None:
        return buffers
    call = "nvmlGpmSampleAlloc"
    if gpu.is_unsupported(call):
        return None
    pair = [gpu.call(call, (call,), lambda fn: fn(), (), learn=True) for _ in range(2)]
    if None in pair:
        for handle in pair:
            if handle is not None:
                gpu.call("nvmlGpmSampleFree", (), lambda fn, h=handle: fn(h), (), learn=False)
        return None
    buffers = state.buffers[instance] = GpmBuffers(*pair)
    return buffers


def gpm_sample(gpu: GpuContext, buffer: Any, instance: int | None) -> bool:
    """Read a GPM sample of the GPU, or of GPU instance ``instance``, into ``buffer``."""
    handle = gpu.device.handle
    if instance is None:
        call, invoke = "nvmlGpmSampleGet", lambda fn: fn(handle, buffer)
    else:
        call, invoke = "nvmlGpmMigSampleGet", lambda fn: fn(handle, instance, buffer)
    if gpu.is_unsupported(call):
        return False
    return gpu.call(call, (call,), invoke, (), learn=True) is not None


def gpm_metrics(gpu: GpuContext, first: Any, second: Any, metric_ids: Sequence[int]) -> dict[int, float]:
    """``nvmlGpmMetricsGet`` between two samples: metric id -> value, in NVML's units.

    Each metric carries its own return code: one the GPU does not support is learned and not asked for
    again; one that failed, or came back NaN (samples too close together), is left out and counted.
    """
    call = "nvmlGpmMetricsGet"
    wanted = [m for m in metric_ids if ("gpm_metric", m) not in gpu.device.unsupported]
    if not wanted or gpu.is_unsupported(call):
        return {}
    request_type = getattr(gpu.nvml, "c_nvmlGpmMetricsGet_t", None)
    if request_type is None:  # a binding older than GPM
        gpu.learn_unsupported((call,), call, ERROR_FUNCTION_NOT_FOUND, learn=True)
        return {}
    request = request_type()
    request.version = _GPM_METRICS_GET_VERSION
    request.numMetrics = len(wanted)
    request.sample1, request.sample2 = first, second
    for slot, metric_id in enumerate(wanted):
        request.metrics[slot].metricId = metric_id
    answer = gpu.call(call, (call,), lambda fn: fn(request), (), learn=True)
    out: dict[int, float] = {}
    for metric in answer.metrics[: len(wanted)] if answer is not None else ():
        if metric.nvmlReturn != SUCCESS:
            gpu.item_failed(call, "gpm_metric", metric.metricId, metric.nvmlReturn)
        elif math.isnan(metric.value):
            gpu.count_error(call, NAN)
        else:
            out[metric.metricId] = float(metric.value)
    return out
