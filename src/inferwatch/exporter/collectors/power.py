"""Power draw, the enforced power limit, and energy as a counter.

Power and the limit are read every poll (microseconds each). The energy counter costs milliseconds to read
and changes only every ~100 ms (tests/benchmarks/nvml_call_cost.py), so it is a firmware reading, read
every fourth poll: ``rate()`` over it loses nothing but freshness of a few seconds.
"""

from __future__ import annotations

from ..firmware import firmware_reading
from ..nvml import GpuContext
from ..samples import gpu_counter, gpu_gauge
from .registry import Registration, register

POWER = gpu_gauge("gpu_power_watts", "Power draw of the board as NVML reports it.")
POWER_LIMIT = gpu_gauge(
    "gpu_power_limit_watts", "Power limit the driver enforces now (the lowest of all active limits)."
)
ENERGY = gpu_counter(
    "gpu_energy_joules_total",
    "Energy used by the GPU since its driver loaded (NVML's counter): a driver reset restarts it at zero.",
)


class PowerCollector:
    name = "power"

    def collect(self, gpu: GpuContext) -> None:
        milliwatts = gpu.read("nvmlDeviceGetPowerUsage")
        if milliwatts is not None:
            gpu.emit(POWER, milliwatts / 1000)
        limit_milliwatts = gpu.read("nvmlDeviceGetEnforcedPowerLimit")
        if limit_milliwatts is not None:
            gpu.emit(POWER_LIMIT, limit_milliwatts / 1000)
        millijoules = firmware_reading(gpu, "energy", lambda: gpu.read("nvmlDeviceGetTotalEnergyConsumption"))
        if millijoules is not None:
            gpu.emit(ENERGY, millijoules / 1000)


register(
    Registration(
        "power",
        "power draw, the enforced power limit, and energy",
        gpu=lambda config, settings, shared: [PowerCollector()],
    )
)
