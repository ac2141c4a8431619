"""Device memory per process using the GPU, named by comm, capped.

Only the ``--processes.max`` processes holding the most memory get a series, so a node running many small
jobs cannot explode the label set; ``gpu_processes`` still counts them all. The PIDs seen here also feed
the serving-process collector (``--processes.gpu``).
"""

from __future__ import annotations

from ..nvml import GpuContext
from ..proc import process_name
from ..samples import gpu_gauge

PROCESS_MEMORY = gpu_gauge(
    "gpu_process_memory_bytes",
    "Device memory used by a compute process; the largest --processes.max per GPU.",
    "pid",
    "comm",
)
PROCESSES = gpu_gauge("gpu_processes", "Compute processes running on the GPU (all, not only those shown).")


class GpuProcessesCollector:
    name = "gpu_processes"

    def __init__(self, max_processes: int) -> None:
        self._max = max_processes

    def collect(self, gpu: GpuContext) -> None:
        processes = gpu.read("nvmlDeviceGetComputeRunningProcesses")
        if processes is None:
            return
        gpu.emit(PROCESSES, len(processes))
        gpu.process_ids.update(p.pid for p in processes)
        # usedGpuMemory is None where the driver cannot attribute memory (e.g. under WDDM).
        measured = [p for p in processes if p.usedGpuMemory is not None]
        measured.sort(key=lambda p: p.usedGpuMemory, reverse=True)
        for p in measured[: self._max]:
            gpu.emit(PROCESS_MEMORY, p.usedGpuMemory, str(p.pid), process_name(p.pid))
