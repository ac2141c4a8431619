"""Firmware readings: NVML readings that cost milliseconds each, read on their own turn, one per poll.

A round trip to the GPU's firmware on recent GPUs costs milliseconds where the other calls of a poll take
microseconds (tests/benchmarks/nvml_call_cost.py: 2.8 ms per utilization sample buffer and 3-4 ms for the
energy counter on an H200, against a 12.8 ms poll; on an H100 under a matmul load 2.1 ms for the
per-process utilization samples, docs/benchmarks.md). Each is read on its own turn, one per poll, and its
last value served in between, so no poll pays for more than one of them. Every one of them is a buffer of
samples since the last reading or a counter, so reading it less often loses nothing but freshness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .nvml import GpuContext

READINGS = (
    "gpu_utilization_samples",
    "memory_bandwidth_utilization_samples",
    "energy",
    "process_utilization_samples",
)

Value = TypeVar("Value")


@dataclass
class FirmwareValues:
    """One GPU's last value of each firmware reading (by name, one of :data:`READINGS`)."""

    values: dict[str, Any] = field(default_factory=dict)


def firmware_reading(gpu: GpuContext, reading: str, read: Callable[[], Value | None]) -> Value | None:
    """The value of ``reading``: ``read()`` on its turn or while no value is known, else the value read
    last. A failed read leaves the series out until the next read."""
    values = gpu.device.state(FirmwareValues).values
    if reading not in values or READINGS[gpu.collection % len(READINGS)] == reading:
        value = read()
        if value is None:
            values.pop(reading, None)
        else:
            values[reading] = value
    return values.get(reading)
