"""The serving process's own NVML view of its model's GPU, for setups without the sidecar exporter.

Runs on the NVML worker thread only. When NVML is absent (no library, no driver) the poller switches itself
off quietly: that is a normal CPU or container set-up, not a fault. A failing reading is counted under
``llm_instrumentation_errors_total{stage="nvml"}`` and retried at the next poll; a reading the device does
not support is skipped from then on.
"""

from __future__ import annotations

import os
from typing import Any

from inferwatch.instrumentation import catalogue as cat
from inferwatch.instrumentation.catalogue import Metrics
from inferwatch.instrumentation.errors import logger


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlPoller:
    """Reads one GPU (found by UUID, else by index) every ``interval`` seconds."""

    def __init__(
        self,
        metrics: Metrics,
        label: str,
        index: int,
        uuid: str | None,
        interval: float,
        nvml: Any = None,
    ) -> None:
        self.interval = interval
        self._label = label
        self._index = index
        self._uuid = uuid
        self._nvml = nvml
        self._errors = metrics.errors
        self._metrics = metrics
        self._handle: Any = None
        self._disabled = False
        self._unsupported: set[str] = set()
        #: Peak memory bandwidth in bytes/s, read once; the model pollers of this device read it (a float
        #: written once by this poller's thread).
        self.peak_bandwidth: float | None = None

    def __repr__(self) -> str:
        return f"NvmlPoller({self._label})"

    def _open(self) -> bool:
        """Initialise NVML and find the device; False when NVML is unavailable here (poller off)."""
        try:
            if self._nvml is None:
                self._nvml = _import_pynvml()
            self._nvml.nvmlInit()
        except Exception as exc:
            self._disabled = True
            logger.info("inferwatch: NVML unavailable (%s); llm_nvml_* metrics are off", exc)
            return False
        nvml = self._nvml
        if self._uuid:
            self._handle = nvml.nvmlDeviceGetHandleByUUID(self._uuid)
        else:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self._index)
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
        self._read("process_memory", self._read_process_memory)
        if self.peak_bandwidth is None:
            self._read("bandwidth", self._read_peak_bandwidth)

    def _set(self, spec: cat.MetricSpec, value: float) -> None:
        # Series appear with their first reading: no NVML, no llm_nvml_* series (rather than zeros).
        self._metrics[spec].labels(self._label).set(value)

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

    def _read_process_memory(self) -> None:
        pid = os.getpid()
        for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if process.pid == pid and process.usedGpuMemory is not None:
                self._set(cat.NVML_PROCESS_MEMORY, process.usedGpuMemory)
                return

    def _read_peak_bandwidth(self) -> None:
        nvml = self._nvml
        bus_width_bits = nvml.nvmlDeviceGetMemoryBusWidth(self._handle)
        max_memory_clock_mhz = nvml.nvmlDeviceGetMaxClockInfo(self._handle, nvml.NVML_CLOCK_MEM)
        # Double data rate: two transfers per memory clock.
        peak = bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2
        if peak > 0:
            self.peak_bandwidth = peak
