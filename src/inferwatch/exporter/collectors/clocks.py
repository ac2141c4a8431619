"""Current and maximum clocks, in hertz, and the performance state."""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_gauge
from .registry import Registration, register

CLOCK = gpu_gauge("gpu_clock_hz", "Current clock frequency by clock domain.", "clock")
CLOCK_MAX = gpu_gauge("gpu_clock_max_hz", "Highest frequency the clock domain can run at.", "clock")
PSTATE = gpu_gauge("gpu_pstate", "Performance state: 0 is maximum performance, 15 minimum.")

# nvmlClockType_t
_CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))
_NVML_PSTATE_UNKNOWN = 32
_MHZ = 1e6


class ClocksCollector:
    name = "clocks"

    def collect(self, gpu: GpuContext) -> None:
        for clock, clock_type in _CLOCKS:
            mhz = gpu.read("nvmlDeviceGetClockInfo", clock_type)
            if mhz is not None:
                gpu.emit(CLOCK, mhz * _MHZ, clock)
            max_mhz = gpu.cached("nvmlDeviceGetMaxClockInfo", clock_type)
            if max_mhz is not None:
                gpu.emit(CLOCK_MAX, max_mhz * _MHZ, clock)
        pstate = gpu.read("nvmlDeviceGetPerformanceState")
        if pstate is not None and pstate != _NVML_PSTATE_UNKNOWN:
            gpu.emit(PSTATE, pstate)


register(
    Registration(
        "clocks",
        "current and maximum clocks, and the performance state",
        gpu=lambda config, settings, shared: [ClocksCollector()],
    )
)
