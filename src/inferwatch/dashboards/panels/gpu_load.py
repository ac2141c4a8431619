"""GPU load and memory (NVML): utilization, memory bandwidth utilization, device memory; and how busy the
SMs, tensor cores and DRAM really are (NVML GPM, on GPUs that have it), each beside the NVML figure it
corrects."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import GREEN, YELLOW, PanelSpec, normal, steps
from .queries import alert_settings, gpu, query


def gpu_utilization() -> PanelSpec:
    return PanelSpec(
        "GPU utilization",
        "Fraction of time a kernel was running (NVML, mean of its samples since the last poll).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [query(gpu(names.GPU_UTILIZATION_RATIO), "GPU {{gpu}} {{instance}}")],
    )


def memory_bandwidth_utilization() -> PanelSpec:
    return PanelSpec(
        "Memory bandwidth utilization",
        "Fraction of time device memory was read or written (NVML).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [query(gpu(names.GPU_MEMORY_BANDWIDTH_UTILIZATION_RATIO), "GPU {{gpu}} {{instance}}")],
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
            query(gpu(names.GPU_MEMORY_USED_BYTES), "used GPU {{gpu}} {{instance}}"),
            query(gpu(names.GPU_MEMORY_TOTAL_BYTES), "total GPU {{gpu}} {{instance}}"),
        ],
    )


def sm_activity() -> PanelSpec:
    return _activity_panel(
        "SM active vs NVML utilization",
        "NVML utilization counts the time any kernel ran; SM active (GPM) the share of SMs that had work. "
        "Utilization high and SM active low: the GPU waits on kernel launches (tiny kernels, a Python loop), "
        "and CUDA graphs, torch.compile or batching help.",
        (names.GPU_UTILIZATION_RATIO, "NVML utilization"),
        (names.GPU_SM_ACTIVE_RATIO, "SM active"),
    )


def tensor_activity() -> PanelSpec:
    return _activity_panel(
        "Tensor core activity and SM occupancy",
        "Share of time the tensor cores worked, and resident warps against the SMs' capacity (GPM). SMs "
        "busy with idle tensor cores: matmuls run in FP32 or on shapes the tensor cores cannot take.",
        (names.GPU_TENSOR_ACTIVE_RATIO, "tensor"),
        (names.GPU_SM_OCCUPANCY_RATIO, "occupancy"),
    )


def dram_activity() -> PanelSpec:
    return _activity_panel(
        "DRAM activity vs NVML memory utilization",
        "DRAM active (GPM): bandwidth used against the peak. NVML's memory utilization counts the time "
        "memory was accessed at all, so it reads far higher for the same traffic.",
        (names.GPU_MEMORY_BANDWIDTH_UTILIZATION_RATIO, "NVML memory utilization"),
        (names.GPU_DRAM_ACTIVE_RATIO, "DRAM active"),
    )


def _activity_panel(title: str, description: str, *series: tuple[str, str]) -> PanelSpec:
    """Shares of time or capacity, one line per (metric, what) and GPU; GPM's also per GPU instance (MIG),
    whose label the NVML figures lack (Grafana leaves it out of their legend)."""
    legend = "GPU {{gpu}} {{gpu_instance}} {{instance}}"
    return PanelSpec(
        title,
        description,
        "percentunit",
        normal(),
        [query(gpu(metric), f"{what} {legend}") for metric, what in series],
    )


def process_sm_utilization() -> PanelSpec:
    return PanelSpec(
        "SM utilization by process",
        "Share of time each compute process had a kernel running (NVML process samples): which process "
        "keeps the GPU busy.",
        "percentunit",
        normal(),
        [query(gpu(names.GPU_PROCESS_SM_UTILIZATION_RATIO), "GPU {{gpu}} {{comm}} ({{pid}})")],
    )
