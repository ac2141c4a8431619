"""The host: CPU time by mode, memory, load averages (psutil)."""

from __future__ import annotations

import os

import psutil

from ..samples import FamilySpec
from .base import HostContext
from .registry import Registration, register

CPU_SECONDS = FamilySpec(
    "host_cpu_seconds_total", "counter", "CPU time of all cores together, by mode.", ("mode",)
)
CPUS = FamilySpec("host_cpus", "gauge", "Logical CPUs.")
MEMORY_TOTAL = FamilySpec("host_memory_total_bytes", "gauge", "Physical memory.")
MEMORY_AVAILABLE = FamilySpec(
    "host_memory_available_bytes", "gauge", "Memory available to new processes without swapping."
)
LOADS = tuple(
    (FamilySpec(f"host_load{window}", "gauge", f"Load average over the last {window} min."), index)
    for index, window in enumerate((1, 5, 15))
)


class HostStatsCollector:
    name = "host"

    def collect(self, host: HostContext) -> None:
        for mode, seconds in psutil.cpu_times()._asdict().items():
            host.emit(CPU_SECONDS, seconds, mode)
        host.emit(CPUS, psutil.cpu_count() or 0)
        memory = psutil.virtual_memory()
        host.emit(MEMORY_TOTAL, memory.total)
        host.emit(MEMORY_AVAILABLE, memory.available)
        loads = os.getloadavg()
        for spec, index in LOADS:
            host.emit(spec, loads[index])


register(
    Registration(
        "host", "host CPU time, memory and load", host=lambda config, settings, shared: [HostStatsCollector()]
    )
)
