"""The NVML stand-in's types: pynvml's ``NVMLError`` with its ``.value`` return code, the return codes,
and the handle of a GPU or MIG device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


@dataclass(frozen=True)
class Scenario:
    """What the GPUs are (the fields are described in the module's docstring)."""

    gpus: int = 2
    not_supported: dict[str, list[int]] = field(default_factory=dict)
    failing: dict[str, list[int]] = field(default_factory=dict)
    nvlink: list[int] = field(default_factory=list)
    mig: list[int] = field(default_factory=list)
    mig_slots: list[int] = field(default_factory=lambda: [0, 1])
    no_gpm: list[int] = field(default_factory=list)
    gpm_nan: list[int] = field(default_factory=list)
    processes: dict[int, list[list[int]]] = field(default_factory=dict)
    hw_slowdown: list[int] = field(default_factory=list)
    init_failures: int = 0
    no_library: bool = False
    driver_loaded_at: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scenario:
        """A scenario from JSON, whose object keys (the GPU indices of ``processes``) are strings."""
        scenario = cls(**data)
        return dataclasses.replace(scenario, processes={int(k): v for k, v in scenario.processes.items()})


def gpu_uuid(gpu: int) -> str:
    """The UUID the stand-in gives GPU ``gpu``, as NVML spells UUIDs."""
    return f"GPU-fa4e0000-0000-4000-8000-{gpu:012d}"


def mig_uuid(gpu: int, slot: int) -> str:
    """The UUID the stand-in gives the MIG device in ``slot`` of GPU ``gpu`` (GPU instance id slot + 1)."""
    return f"MIG-fa4e{gpu:04d}-0000-4000-8000-{slot:012d}"
