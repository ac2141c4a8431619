"""GPU and memory-bandwidth utilization, averaged over NVML's samples since the previous reading.

NVML keeps a ring buffer of utilization samples (one every ~1/6 s on recent GPUs, ~70 held on an H200). A
single ``nvmlDeviceGetUtilizationRates`` reading, what nvidia-smi and most exporters report, covers only
the driver's last sample period, so a 1 s poll of a bursty decode loop sees a random phase of it.
Averaging every sample newer than the last one seen gives the true mean since the previous reading. Each
buffer costs milliseconds to read, so each is read on its own poll turn, every fourth poll (see
``firmware.py``): the mean then covers four poll intervals, none of them missed.
When a GPU keeps no samples (or none arrived since the last reading) the point reading is used instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..firmware import firmware_reading
from ..nvml import GpuContext, union_value
from ..samples import FamilySpec, gpu_gauge
from .registry import Registration, register

GPU_UTILIZATION = gpu_gauge(
    "gpu_utilization_ratio",
    "Fraction of time a kernel was running: mean of NVML's samples since the last reading (every 4th poll).",
)
MEMORY_BANDWIDTH_UTILIZATION = gpu_gauge(
    "gpu_memory_bandwidth_utilization_ratio",
    "Fraction of time device memory was read or written: mean of NVML's samples since the last reading.",
)

# nvmlSamplingType_t
_GPU_UTILIZATION_SAMPLES = 1
_MEMORY_UTILIZATION_SAMPLES = 2
# (metric, firmware reading, sample type, attribute of the point reading nvmlUtilization_t)
_KINDS: tuple[tuple[FamilySpec, str, int, str], ...] = (
    (GPU_UTILIZATION, "gpu_utilization_samples", _GPU_UTILIZATION_SAMPLES, "gpu"),
    (
        MEMORY_BANDWIDTH_UTILIZATION,
        "memory_bandwidth_utilization_samples",
        _MEMORY_UTILIZATION_SAMPLES,
        "memory",
    ),
)


@dataclass
class LastSamples:
    """The timestamp (µs) of the newest sample already averaged, by sample type, on one GPU."""

    seen_us: dict[int, int] = field(default_factory=dict)


class UtilizationCollector:
    name = "utilization"

    def collect(self, gpu: GpuContext) -> None:
        for spec, reading, sample_type, attribute in _KINDS:
            percent = firmware_reading(gpu, reading, functools.partial(_percent, gpu, sample_type, attribute))
            if percent is not None:
                gpu.emit(spec, percent / 100)


def _percent(gpu: GpuContext, sample_type: int, attribute: str) -> float | None:
    """The mean of the new samples, else the point reading (cheap: the driver answers it from memory)."""
    percent = _mean_of_new_samples(gpu, sample_type)
    if percent is None:
        point = gpu.read("nvmlDeviceGetUtilizationRates")
        percent = None if point is None else getattr(point, attribute)
    return percent


def _mean_of_new_samples(gpu: GpuContext, sample_type: int) -> float | None:
    """Mean of the samples newer than those seen at the last reading, in percent; None if there are none."""
    seen_us = gpu.device.state(LastSamples).seen_us
    last_seen = seen_us.get(sample_type, 0)
    result = gpu.read_samples(sample_type, last_seen)
    if not result:
        return None
    value_type, samples = result
    fresh = [s for s in samples if s.timeStamp > last_seen]
    if not fresh:
        return None
    seen_us[sample_type] = max(s.timeStamp for s in fresh)
    return sum(union_value(value_type, s.sampleValue) for s in fresh) / len(fresh)


register(
    Registration(
        "utilization",
        "GPU and memory-bandwidth utilization, the mean of NVML's samples",
        gpu=lambda config, settings, shared: [UtilizationCollector()],
    )
)
