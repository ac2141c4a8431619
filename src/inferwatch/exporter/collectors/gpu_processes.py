"""Device memory and utilization per process using the GPU, named by comm, capped.

Only the ``--processes.max`` processes holding the most memory get series, so a node running many small
jobs cannot explode the label set; ``gpu_processes`` still counts them all. The PIDs seen here also feed
the serving-process collector (``--processes.gpu``).

Utilization comes from NVML's per-process samples (``nvmlDeviceGetProcessUtilization``): the mean of
those newer than the previous reading's. The call costs milliseconds under load (a firmware round trip),
so it is a firmware reading (``firmware.py``), made every fourth poll and its means served in between.
NVML keeps samples only of processes that were busy, so a tracked process without one was idle (0); when
the call fails, the utilization series are left out instead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..firmware import firmware_reading
from ..nvml import GpuContext
from ..proc import process_name
from ..samples import gpu_gauge

PROCESS_MEMORY = gpu_gauge(
    "gpu_process_memory_bytes",
    "Device memory used by a compute process; the largest --processes.max per GPU.",
    "pid",
    "comm",
)
PROCESS_SM_UTILIZATION = gpu_gauge(
    "gpu_process_sm_utilization_ratio",
    "Fraction of time a kernel of the process ran on the SMs (NVML's process samples, every 4th poll).",
    "pid",
    "comm",
)
PROCESS_MEMORY_UTILIZATION = gpu_gauge(
    "gpu_process_memory_bandwidth_utilization_ratio",
    "Fraction of time the process read or wrote device memory (its samples, every 4th poll).",
    "pid",
    "comm",
)
PROCESSES = gpu_gauge("gpu_processes", "Compute processes running on the GPU (all, not only those shown).")


@dataclass
class LastProcessSample:
    """The timestamp (µs) of the newest per-process utilization sample already averaged, on one GPU."""

    seen_us: int = 0


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
        shown = [(p, str(p.pid), process_name(p.pid)) for p in measured[: self._max]]
        for p, pid, comm in shown:
            gpu.emit(PROCESS_MEMORY, p.usedGpuMemory, pid, comm)
        utilization = (
            firmware_reading(gpu, "process_utilization_samples", lambda: _utilization_since_last_reading(gpu))
            if shown
            else None
        )
        if utilization is None:
            return
        for p, pid, comm in shown:
            sm, memory = utilization.get(p.pid, (0.0, 0.0))
            gpu.emit(PROCESS_SM_UTILIZATION, sm / 100, pid, comm)
            gpu.emit(PROCESS_MEMORY_UTILIZATION, memory / 100, pid, comm)


def _utilization_since_last_reading(gpu: GpuContext) -> dict[int, tuple[float, float]] | None:
    """pid -> mean (SM, memory) utilization in percent of its samples since the last reading; None when
    the samples could not be read."""
    state = gpu.device.state(LastProcessSample)
    last_seen = state.seen_us
    samples = gpu.read_process_utilization(last_seen)
    if samples is None:
        return None
    by_pid: defaultdict[int, list[Any]] = defaultdict(list)
    for sample in samples:
        if sample.timeStamp > last_seen:
            by_pid[sample.pid].append(sample)
    if by_pid:
        state.seen_us = max(s.timeStamp for group in by_pid.values() for s in group)
    return {
        pid: (sum(s.smUtil for s in group) / len(group), sum(s.memUtil for s in group) / len(group))
        for pid, group in by_pid.items()
    }
