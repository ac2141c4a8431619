"""GPU load and memory (NVML): utilization, memory bandwidth utilization, device memory."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import GREEN, YELLOW, PanelSpec, Query, normal, steps
from .queries import GPU, alert_settings, sel


def gpu_utilization() -> PanelSpec:
    return PanelSpec(
        "GPU utilization",
        "Fraction of time a kernel was running (NVML, mean of its samples since the last poll).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [Query(sel(names.GPU_UTILIZATION_RATIO, GPU), "GPU {{gpu}} {{instance}}")],
    )


def memory_bandwidth_utilization() -> PanelSpec:
    return PanelSpec(
        "Memory bandwidth utilization",
        "Fraction of time device memory was read or written (NVML).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [Query(sel(names.GPU_MEMORY_BANDWIDTH_UTILIZATION_RATIO, GPU), "GPU {{gpu}} {{instance}}")],
    )


def device_memory() -> PanelSpec:
    used_ratio = alert_settings("InferwatchGpuMemoryFillingUp")["used_ratio_above"]
    return PanelSpec(
        "Device memory",
        f"Used and total device memory. InferwatchGpuMemoryFillingUp fires when more than {used_ratio:.0%} "
        "is used and the trend crosses the total within the hour.",
        "bytes",
        normal(),
        [
            Query(sel(names.GPU_MEMORY_USED_BYTES, GPU), "used GPU {{gpu}} {{instance}}"),
            Query(sel(names.GPU_MEMORY_TOTAL_BYTES, GPU), "total GPU {{gpu}} {{instance}}"),
        ],
    )
