"""Device memory from NVML's v2 memory API, which reports the driver-reserved part separately.

With the v1 API the reserved memory is counted as used, so an idle GPU looks partly full and free memory
disagrees with what CUDA reports. v1 is used only where the driver or binding lacks v2.
"""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_gauge
from .registry import Registration, register

MEMORY_TOTAL = gpu_gauge("gpu_memory_total_bytes", "Installed device memory.")
MEMORY_USED = gpu_gauge("gpu_memory_used_bytes", "Device memory allocated by processes.")
MEMORY_FREE = gpu_gauge("gpu_memory_free_bytes", "Device memory available for allocation.")
MEMORY_RESERVED = gpu_gauge(
    "gpu_memory_reserved_bytes", "Device memory the driver and firmware reserve (v2 API only)."
)

_CALL = "nvmlDeviceGetMemoryInfo"


class MemoryCollector:
    name = "memory"

    def collect(self, gpu: GpuContext) -> None:
        v2 = getattr(gpu.nvml, "nvmlMemory_v2", None)
        info = gpu.read(_CALL, v2) if v2 is not None else None
        if info is None and (v2 is None or gpu.is_unsupported(_CALL, v2)):
            info = gpu.read(_CALL)
        if info is None:
            return
        gpu.emit(MEMORY_TOTAL, info.total)
        gpu.emit(MEMORY_USED, info.used)
        gpu.emit(MEMORY_FREE, info.free)
        reserved = getattr(info, "reserved", None)
        if reserved is not None:
            gpu.emit(MEMORY_RESERVED, reserved)


register(
    Registration(
        "memory",
        "device memory: total, used, free and driver-reserved",
        gpu=lambda config, settings, shared: [MemoryCollector()],
    )
)
