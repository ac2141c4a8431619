"""The graphics engine's activity of one GPU from NVML's GPM (Hopper and newer): the share of time it
had work between two samples.

It is GPM's ``GRAPHICS_UTIL`` (DCGM's ``GR_ENGINE_ACTIVE``), a counter of the engine's active time over
exactly the window between two polls, where NVML's utilization is a mean of its own sample periods. On an
H100 both read within 0.01 of each other, and above the profiler's union of kernel intervals by the
engine's time around each kernel (0.05 at 28 k kernels/s, 0.07 at 88 k): docs/benchmarks.md, "The GPU busy
ratio, each source against the trace".

GPM counts the whole GPU (or a GPU instance under MIG), not one process: the busy meter takes it only
where the GPU's figure is this process's (:mod:`.busy`). NVML keeps the sample buffers; each reader holds
two and gives them back in :meth:`GraphicsActivity.close`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

# NVML_GPM_METRIC_GRAPHICS_UTIL and NVML_GPM_METRICS_GET_VERSION: part of NVML's C ABI.
GRAPHICS_UTIL = 1
_METRICS_GET_VERSION = 1
#: NVML needs two GPM samples more than 100 ms apart (closer ones give 0 or NaN).
MIN_SECONDS = 0.1


class GraphicsActivity:
    """Reads the graphics-engine activity of one GPU since the previous read.

    Raises what NVML raises other than "not supported" (the caller counts it); once the GPU has answered
    "not supported", or the binding lacks GPM, :attr:`supported` is False and nothing is asked again.
    """

    def __init__(self, nvml: Any, handle: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._handle = handle
        self._clock = clock
        self._samples: list[Any] = []  # [opened, spare] once allocated
        self._opened_at: float | None = None
        #: None until asked, then whether this GPU answers GPM.
        self.supported: bool | None = None

    def read(self) -> float | None:
        """The active share of the time since the previous read; None on the first read, within
        :data:`MIN_SECONDS` of the previous one, or where the GPU has no GPM."""
        if self.supported is False or not self._ready():
            return None
        now = self._clock()
        if self._opened_at is not None and now - self._opened_at <= MIN_SECONDS:
            return None
        opened, spare = self._samples
        self._call(lambda: self._nvml.nvmlGpmSampleGet(self._handle, spare))
        share = None if self._opened_at is None else self._metric(opened, spare)
        self._samples.reverse()
        self._opened_at = now
        return share

    def restart(self) -> None:
        """The next read opens a new window (what ran since the last read is not this reader's)."""
        self._opened_at = None

    def close(self) -> None:
        """Give NVML the sample buffers back (a free that fails can only be dropped)."""
        samples, self._samples = self._samples, []
        for sample in samples:
            with contextlib.suppress(Exception):  # host memory of a session that may be gone
                self._nvml.nvmlGpmSampleFree(sample)
        self.restart()

    def _ready(self) -> bool:
        """Whether the GPU has GPM and this reader holds its two buffers (asked and allocated once)."""
        if self.supported is None:
            query = getattr(self._nvml, "nvmlGpmQueryDeviceSupport", None)
            if query is None or getattr(self._nvml, "c_nvmlGpmMetricsGet_t", None) is None:
                self.supported = False  # a binding older than GPM
                return False
            support = self._call(lambda: query(self._handle))
            self.supported = bool(support is not None and support.isSupportedDevice)
            if not self.supported:
                return False
        while len(self._samples) < 2:
            sample = self._call(self._nvml.nvmlGpmSampleAlloc)
            if sample is None:
                return False
            self._samples.append(sample)
        return True

    def _metric(self, first: Any, second: Any) -> float | None:
        request = self._nvml.c_nvmlGpmMetricsGet_t()
        request.version = _METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = GRAPHICS_UTIL
        self._call(lambda: self._nvml.nvmlGpmMetricsGet(request))
        metric = request.metrics[0]
        if metric.nvmlReturn == getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
            self.supported = False
            return None
        if metric.nvmlReturn != getattr(self._nvml, "NVML_SUCCESS", 0) or math.isnan(metric.value):
            return None
        return min(1.0, max(0.0, metric.value / 100))

    def _call(self, invoke: Callable[[], Any]) -> Any:
        """``invoke()``; None once the GPU answers "not supported" (learned: not asked again)."""
        try:
            return invoke()
        except Exception as exc:
            if getattr(exc, "value", None) == getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                self.supported = False
                return None
            raise
