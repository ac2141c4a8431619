"""Periodic readings on the background thread: allocator memory of a device, and a model's windows.

None of these calls launches device work or synchronizes: ``torch.cuda.memory_stats`` reads the caching
allocator's host-side counters, ``torch.cuda.mem_get_info`` asks the driver for free memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from inferwatch.instrumentation.device.busy import BusyReading
from inferwatch.instrumentation.device.hardware import DeviceIdentity
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.catalogue import Metrics
from inferwatch.instrumentation.metrics.model_series import ModelSeries, drop_gauge

# llm_torch_memory_bytes{kind} <- torch.cuda.memory_stats() key.
MEMORY_KINDS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "active": "active_bytes.all.current",
    "max_allocated": "allocated_bytes.all.peak",
}


class CudaAllocatorPoller:
    """torch's caching-allocator state of one CUDA device (process-wide, so one per device)."""

    def __init__(self, metrics: Metrics, device: torch.device, identity: DeviceIdentity, interval: float):
        self.interval = interval
        self._device = device
        self._errors = metrics.errors
        self._labels = identity.labels
        self._memory = metrics[cat.TORCH_MEMORY]
        self._retries = metrics[cat.ALLOC_RETRIES]
        self._last_retries: int | None = None

    def __repr__(self) -> str:
        return f"CudaAllocatorPoller({self._device})"

    def poll(self) -> None:
        try:
            stats = torch.cuda.memory_stats(self._device)
            for kind, key in MEMORY_KINDS.items():
                self._memory.labels(*self._labels, kind).set(stats.get(key, 0))
            retries = stats.get("num_alloc_retries", 0)
            # Counted from the first poll on (the series exists from then, at 0). The allocator's count
            # can be reset (reset_accumulated_memory_stats): then counting starts anew.
            last = retries if self._last_retries is None else self._last_retries
            self._retries.labels(*self._labels).inc(max(0, retries - last))
            self._last_retries = retries
        except Exception as exc:
            self._errors.report("sample", exc)


def free_memory_bytes(device: torch.device) -> int | None:
    """Bytes a new KV-cache allocation could still use on ``device``: free device memory plus what
    torch's allocator holds cached but unused; host available memory for CPU models."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            import psutil
        except ImportError:
            return None
        return psutil.virtual_memory().available
    return None


class ModelPoller:
    """Turns one model's forward work since the last poll into forward-time / bandwidth / FLOP ratios,
    its GPU's busy share (measured by the NVML poller) into its busy ratio, and its KV bytes per token
    into headroom tokens."""

    def __init__(
        self,
        series: ModelSeries,
        device: torch.device,
        identity: DeviceIdentity,
        interval: float,
        peak_flops: float | None,
        peak_bandwidth: Callable[[], float | None],
        busy: Callable[[], BusyReading | None] | None = None,
    ) -> None:
        self.interval = interval
        self._series = series
        self._device = device
        self._label = identity.device  # the key of the model's work windows
        self._labels = identity.labels
        self._peak_flops = peak_flops
        self._peak_bandwidth = peak_bandwidth
        #: This process's busy share of the model's GPU (None: not measured, as on the CPU: no series).
        self._busy_reading = busy
        self._busy_source: str | None = None
        # Each ratio gets its series at its first real value: a ratio that cannot be computed here (no
        # known peak, no decode yet) is absent rather than a misleading 0.
        metrics = series.metrics
        self._busy = metrics[cat.GPU_BUSY]
        self._forward_time = metrics[cat.FORWARD_TIME_RATIO]
        self._bandwidth = metrics[cat.DECODE_BANDWIDTH]
        self._flops = metrics[cat.PREFILL_FLOPS]
        self._headroom = metrics[cat.KV_CACHE_HEADROOM_TOKENS]
        self._last = time.perf_counter()

    def __repr__(self) -> str:
        return f"ModelPoller({self._series.name}, {self._label})"

    def poll(self) -> None:
        try:
            now = time.perf_counter()
            wall, self._last = now - self._last, now
            window = self._series.take_window(self._label)
            self._series.refresh_running_age_between_scrapes()
            model, labels = self._series.name, self._labels
            if wall > 0:
                self._forward_time.labels(model, *labels).set(min(1.0, window.forward_seconds / wall))
            if self._busy_reading is not None:
                self._publish_busy(self._busy_reading())
            peak_bandwidth = self._peak_bandwidth()
            if window.decode_seconds > 0 and peak_bandwidth:
                utilization = window.decode_bytes / window.decode_seconds / peak_bandwidth
                self._bandwidth.labels(model, *labels).set(utilization)
            if window.prefill_seconds > 0 and self._peak_flops:
                utilization = window.prefill_flops / window.prefill_seconds / self._peak_flops
                self._flops.labels(model, *labels).set(utilization)
            per_token = self._series.bytes_per_token
            # Continuous batching's headroom is what is left of its preallocated pool, not free memory.
            if not self._series.poll_paged_cache() and per_token:
                free = free_memory_bytes(self._device)
                if free is not None:
                    self._headroom.labels(model).set(max(0.0, free / per_token))
        except Exception as exc:
            self._series.errors.report("sample", exc)

    def _publish_busy(self, reading: BusyReading | None) -> None:
        """The busy ratio under its source; no series while there is no reading."""
        model, labels = self._series.name, self._labels
        source = None if reading is None else reading.source
        if self._busy_source not in (None, source):
            drop_gauge(self._busy, model, *labels, self._busy_source)
        self._busy_source = source
        if reading is not None:
            self._busy.labels(model, *labels, source).set(min(1.0, reading.ratio))
