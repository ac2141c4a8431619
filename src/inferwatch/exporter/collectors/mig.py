"""MIG: whether the GPU is partitioned, and the memory of each MIG device."""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_gauge
from .registry import Registration, register

MIG_MODE = gpu_gauge("gpu_mig_mode", "1 when MIG (multi-instance GPU) mode is enabled.")
MIG_MEMORY_TOTAL = gpu_gauge("gpu_mig_memory_total_bytes", "Device memory of one MIG device.", "mig")
MIG_MEMORY_USED = gpu_gauge("gpu_mig_memory_used_bytes", "Device memory allocated on one MIG device.", "mig")


class MigCollector:
    name = "mig"

    def collect(self, gpu: GpuContext) -> None:
        mode = gpu.read("nvmlDeviceGetMigMode")
        if mode is None:
            return
        current = mode[0]
        gpu.emit(MIG_MODE, current)
        if not current:
            return
        for slot, handle in gpu.mig_devices():
            info = gpu.read("nvmlDeviceGetMemoryInfo", handle=handle)
            if info is not None:
                gpu.emit(MIG_MEMORY_TOTAL, info.total, str(slot))
                gpu.emit(MIG_MEMORY_USED, info.used, str(slot))


register(
    Registration(
        "mig",
        "MIG mode and the memory of each MIG device",
        gpu=lambda config, settings, shared: [MigCollector()],
    )
)
