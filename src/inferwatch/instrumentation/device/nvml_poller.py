"""The serving process's own NVML view of its model's GPU, for setups without the sidecar exporter.

Runs on the NVML worker thread only. When NVML is absent (no library, no driver) the poller switches itself
off quietly: that is a normal CPU or container set-up, not a fault. A failing reading is counted under
``llm_instrumentation_errors_total{stage="nvml"}`` and retried at the next poll; a reading the device does
not support is skipped from then on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inferwatch.instrumentation.device import busy
from inferwatch.instrumentation.device.hardware import DeviceIdentity
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics import vocabulary
from inferwatch.instrumentation.metrics.catalogue import Metrics
from inferwatch.instrumentation.metrics.containment import logger
from inferwatch.instrumentation.metrics.model_series import drop_gauge


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlPoller:
    """Reads one GPU (found by UUID, else by index) every ``interval`` seconds."""

    def __init__(
        self,
        metrics: Metrics,
        identity: DeviceIdentity,
        index: int,
        interval: float,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._labels = identity.labels
        self._index = index
        # A MIG instance's own handle: NVML's readings of the parent GPU are not this process's device.
        self._uuid = identity.mig_uuid or identity.uuid
        self._nvml = nvml
        self._clock = clock
        self._errors = metrics.errors
        self._metrics = metrics
        self._handle: Any = None
        self._disabled = False
        self._unsupported: set[str] = set()
        self._meter: busy.BusyMeter | None = None
        self._unavailable: str | None = None  # the reason llm_gpu_busy_unavailable shows now
        #: Peak memory bandwidth in bytes/s, read once; the model pollers of this device read it (a float
        #: written once by this poller's thread).
        self.peak_bandwidth: float | None = None
        #: This process's busy share of the GPU at the last poll (busy.BusyMeter); the model pollers of
        #: this device publish it. None while it cannot be measured.
        self.busy: busy.BusyReading | None = None

    def __repr__(self) -> str:
        return f"NvmlPoller({self._labels[0]})"

    def _open(self) -> bool:
        """Initialise NVML and find the device; False when NVML is unavailable here (poller off)."""
        try:
            if self._nvml is None:
                self._nvml = _import_pynvml()
            self._nvml.nvmlInit()
        except Exception as exc:
            self._disabled = True
            self._busy_unavailable(vocabulary.NVML_UNAVAILABLE)
            logger.info("inferwatch: NVML unavailable (%s); llm_nvml_* metrics are off", exc)
            return False
        nvml = self._nvml
        if self._uuid:
            self._handle = nvml.nvmlDeviceGetHandleByUUID(self._uuid)
        else:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self._index)
        self._meter = busy.BusyMeter(nvml, self._handle, clock=self._clock)
        return True

    def poll(self) -> None:
        if self._disabled:
            return
        try:
            if self._handle is None and not self._open():
                return
        except Exception as exc:
            self._errors.report("nvml", exc)
            return
        self._read("utilization", self._read_utilization)
        self._read("memory", self._read_memory)
        self._read("processes", self._read_processes)
        if "processes" in self._unsupported:
            self._busy_unavailable(vocabulary.NOT_SUPPORTED)
        if self.peak_bandwidth is None:
            self._read("bandwidth", self._read_peak_bandwidth)

    def close(self) -> None:
        """The poller is no longer polled (the worker calls this on its thread, after the last poll)."""
        if self._meter is not None:
            self._meter.close()

    def _set(self, spec: cat.MetricSpec, value: float) -> None:
        # Series appear with their first reading: no NVML, no llm_nvml_* series (rather than zeros).
        self._metrics[spec].labels(*self._labels).set(value)

    def _read(self, what: str, reader: Any) -> None:
        if what in self._unsupported:
            return
        try:
            reader()
        except Exception as exc:
            if getattr(exc, "value", None) == getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                self._unsupported.add(what)
                return
            self._errors.report("nvml", exc)

    def _read_utilization(self) -> None:
        utilization = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0
        self._set(cat.NVML_GPU_UTILIZATION, utilization)

    def _read_memory(self) -> None:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        self._set(cat.NVML_MEMORY_USED, info.used)
        self._set(cat.NVML_MEMORY_TOTAL, info.total)

    def _read_processes(self) -> None:
        """This process's memory and busy share, from the GPU's compute processes."""
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            listed = {process.pid for process in processes}
            mine, _ = busy.identify(listed, self._meter.own)
            used = [p.usedGpuMemory for p in processes if p.pid in mine and p.usedGpuMemory is not None]
            if used:
                self._set(cat.NVML_PROCESS_MEMORY, sum(used))
            reading = self._meter.read(listed)
        except Exception:
            self.busy = None  # never a reading of the past
            raise
        # One assignment: the model pollers read it from their own thread, at the same interval.
        self.busy = reading if isinstance(reading, busy.BusyReading) else None
        self._busy_unavailable(reading if isinstance(reading, str) else None)

    def _busy_unavailable(self, reason: str | None) -> None:
        """Show ``reason`` in llm_gpu_busy_unavailable (None: the busy ratio is measured)."""
        if reason == self._unavailable:
            return
        family = self._metrics[cat.GPU_BUSY_UNAVAILABLE]
        if self._unavailable is not None:
            drop_gauge(family, *self._labels, self._unavailable)
        if reason is not None:
            family.labels(*self._labels, reason).set(1)
        self._unavailable = reason

    def _read_peak_bandwidth(self) -> None:
        nvml = self._nvml
        bus_width_bits = nvml.nvmlDeviceGetMemoryBusWidth(self._handle)
        max_memory_clock_mhz = nvml.nvmlDeviceGetMaxClockInfo(self._handle, nvml.NVML_CLOCK_MEM)
        # Double data rate: two transfers per memory clock.
        peak = bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2
        if peak > 0:
            self.peak_bandwidth = peak
