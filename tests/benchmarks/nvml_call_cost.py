"""What each NVML call of the exporter costs on this GPU, and what cheaper ways to read the same data cost.

Three parts, on the first selected GPU:

* **per call**: the exporter's own collectors run ``--polls`` times through a binding that times every
  NVML function, so the figures are those of the exact calls and arguments a poll makes;
* **side by side**: ways to read the same values, interleaved ``--repeat`` times: a second's worth of
  utilization samples against the point reading; power draw, enforced limit and energy as three calls,
  against one ``nvmlDeviceGetFieldValues`` call, against each alone;
* **energy counter**: how often ``nvmlDeviceGetTotalEnergyConsumption`` changes value, and the mean power
  derived from its delta over one second beside ``nvmlDeviceGetPowerUsage`` read in the same second.

    python3 tests/benchmarks/nvml_call_cost.py [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pynvml

from inferwatch.exporter.collectors import gpu_collectors
from inferwatch.exporter.config import ExporterConfig
from inferwatch.exporter.nvml import GpuContext, NvmlSession
from inferwatch.exporter.selfmetrics import NVML_ERRORS, Tally

GPU_UTILIZATION_SAMPLES = 1
FIELD_TOTAL_ENERGY = 83
FIELD_POWER_INSTANT = 186
FIELD_POWER_CURRENT_LIMIT = 190


class TimedBinding(ModuleType):
    """pynvml, with the wall time of every ``nvml*`` function call recorded per name."""

    def __init__(self, binding: ModuleType) -> None:
        super().__init__("timed_nvml")
        self._binding = binding
        self.times: dict[str, list[float]] = collections.defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._binding, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args)
            finally:
                self.times[name].append(time.perf_counter() - started)

        return timed


def per_call(session: NvmlSession, polls: int) -> dict[str, dict[str, float]]:
    """Mean time and calls per poll of each NVML function in ``polls`` polls after one that fills caches."""
    binding = TimedBinding(session.nvml)
    device = session.devices[0]
    collectors = gpu_collectors(ExporterConfig())
    for poll in range(polls + 1):
        if poll == 1:
            binding.times.clear()
        context = GpuContext(binding, device, Tally(NVML_ERRORS))
        for collector in collectors:
            collector.collect(context)
        time.sleep(0.2)
    return {
        name: {"mean_ms": statistics.fmean(times) * 1e3, "calls_per_poll": len(times) / polls}
        for name, times in sorted(binding.times.items(), key=lambda item: -sum(item[1]))
    }


def side_by_side(handle: Any, repeat: int) -> dict[str, dict[str, float]]:
    """Median and p90 (ms) of each way of reading, the ways interleaved so drift hits them all alike."""
    last_seen = [int(time.time() * 1e6) - 2_000_000]

    def samples() -> None:
        with contextlib.suppress(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetSamples(handle, GPU_UTILIZATION_SAMPLES, last_seen[0])

    ways: dict[str, Callable[[], Any]] = {
        "utilization samples since 1 s ago": samples,
        "utilization point reading": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "power: usage + enforced limit + energy, 3 calls": lambda: (
            pynvml.nvmlDeviceGetPowerUsage(handle),
            pynvml.nvmlDeviceGetEnforcedPowerLimit(handle),
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        ),
        "power: the same 3 values, one field-values call": lambda: pynvml.nvmlDeviceGetFieldValues(
            handle, [FIELD_POWER_INSTANT, FIELD_POWER_CURRENT_LIMIT, FIELD_TOTAL_ENERGY]
        ),
        "power usage alone": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "energy counter alone": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
    }
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeat):
        last_seen[0] = int(time.time() * 1e6) - 1_000_000  # a 1 s poll's worth of new samples
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - started)
        time.sleep(0.02)
    return {
        name: {
            "median_ms": statistics.median(t) * 1e3,
            "p90_ms": statistics.quantiles(t, n=10)[-1] * 1e3,
        }
        for name, t in times.items()
    }


def energy_counter(handle: Any, seconds: float) -> dict[str, float]:
    """Update period of the energy counter, and power from its delta against nvmlDeviceGetPowerUsage."""
    changes: list[float] = []
    last_value = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        if value != last_value:
            changes.append(time.monotonic())
            last_value = value
        time.sleep(0.002)
    periods = [b - a for a, b in itertools.pairwise(changes)]
    pairs = []
    for _ in range(3):
        t0, e0 = time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        usage = []
        while time.monotonic() - t0 < 1.0:
            usage.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
            time.sleep(0.05)
        t1, e1 = time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        pairs.append(((e1 - e0) / 1e3 / (t1 - t0), statistics.fmean(usage)))
    return {
        "update_period_median_ms": statistics.median(periods) * 1e3 if periods else float("nan"),
        "update_period_max_ms": max(periods) * 1e3 if periods else float("nan"),
        "energy_delta_watts": [round(p[0], 2) for p in pairs],
        "power_usage_mean_watts": [round(p[1], 2) for p in pairs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--energy-seconds", type=float, default=3.0)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()

    session = NvmlSession.open(pynvml)
    try:
        if not session.devices:
            print("no GPU", file=sys.stderr)
            return 1
        handle = session.devices[0].handle
        ring = pynvml.nvmlDeviceGetSamples(handle, GPU_UTILIZATION_SAMPLES, 0)[1]
        results = {
            "gpu": pynvml.nvmlDeviceGetName(handle),
            "driver": session.driver_version,
            "utilization_samples_held": len(ring),
            "per_call": per_call(session, args.polls),
            "side_by_side": side_by_side(handle, args.repeat),
            "energy_counter": energy_counter(handle, args.energy_seconds),
        }
    finally:
        session.close()

    print(f"# {results['gpu']}, driver {results['driver']}; utilization samples held: {len(ring)}")
    print("\n| NVML call (as a poll makes it) | mean ms | calls per poll |\n|---|---|---|")
    for name, figures in results["per_call"].items():
        print(f"| {name} | {figures['mean_ms']:.3f} | {figures['calls_per_poll']:.1f} |")
    print("\n| way of reading | median ms | p90 ms |\n|---|---|---|")
    for name, figures in results["side_by_side"].items():
        print(f"| {name} | {figures['median_ms']:.3f} | {figures['p90_ms']:.3f} |")
    print(f"\nenergy counter: {results['energy_counter']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
