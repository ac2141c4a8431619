"""Temperatures of the GPU die and its memory, and the thresholds that slow it down or shut it off."""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_gauge
from .registry import Registration, register

TEMPERATURE = gpu_gauge("gpu_temperature_celsius", "Temperature by sensor (gpu die, memory).", "sensor")
TEMPERATURE_THRESHOLD = gpu_gauge(
    "gpu_temperature_threshold_celsius",
    "Temperature at which the GPU acts: slowdown (clocks drop), shutdown, mem_max and gpu_max (the "
    "highest temperature the memory / die may reach under normal operation).",
    "kind",
)

_NVML_TEMPERATURE_GPU = 0
# nvmlDeviceGetTemperature is deprecated (to go with CUDA 14); older drivers have only it.
_TEMPERATURE_CALLS = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
_NVML_FI_DEV_MEMORY_TEMP = 82
# nvmlTemperatureThresholds_t
_THRESHOLDS = (("shutdown", 0), ("slowdown", 1), ("mem_max", 2), ("gpu_max", 3))


class ThermalCollector:
    name = "thermal"

    def collect(self, gpu: GpuContext) -> None:
        die = gpu.read_first(_TEMPERATURE_CALLS, _NVML_TEMPERATURE_GPU)
        if die is not None:
            gpu.emit(TEMPERATURE, die, "gpu")
        memory = gpu.read_fields([_NVML_FI_DEV_MEMORY_TEMP]).get(_NVML_FI_DEV_MEMORY_TEMP)
        if memory is not None:
            gpu.emit(TEMPERATURE, memory, "memory")
        for kind, threshold in _THRESHOLDS:
            celsius = gpu.cached("nvmlDeviceGetTemperatureThreshold", threshold)
            if celsius is not None:
                gpu.emit(TEMPERATURE_THRESHOLD, celsius, kind)


register(
    Registration(
        "thermal",
        "GPU and memory temperatures and their thresholds",
        gpu=lambda config, settings, shared: [ThermalCollector()],
    )
)
