"""Profiling metrics from NVML's GPM (GPU Performance Monitoring; Hopper and newer): how busy the SMs,
tensor cores and DRAM really are, where ``gpu_utilization_ratio`` only says that some kernel ran.

A launch-bound decode loop of tiny kernels keeps NVML's utilization at 20-100 % while the SMs idle (an
H200: 17-25 % utilization, 2 % SM activity); GPM tells the two apart, as DCGM's profiling fields do,
without DCGM. Each metric is NVML's ratio between two samples of the GPU's counters; the window between
them is ``--collector.gpm.window``, independent of the poll interval: a poll that comes before the window
is up serves the values of the last window again. Per GPU instance too when MIG is on (label
``gpu_instance``; empty for the whole GPU). PCIe throughput comes from GPM where it exists, with no
blocking 20 ms reading. A GPU without GPM has none of these series and counts ``not_supported`` once.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.common.durations import parse_duration

from ..gpm_samples import GPM_MIN_SECONDS, GpmState, gpm_buffers, gpm_metrics, gpm_sample
from ..nvml import GpuContext
from ..options import Option
from ..samples import GPU_LABELS, FamilySpec, gpu_gauge
from .registry import Registration, register
from .series import PCIE_RX, PCIE_TX


def _activity(name: str, help_: str) -> FamilySpec:
    return FamilySpec(
        name, "gauge", f"{help_}, over the GPM window (NVML GPM).", (*GPU_LABELS, "gpu_instance")
    )


GRAPHICS_ACTIVE = _activity(
    "gpu_graphics_active_ratio", "Fraction of time the graphics engine had work: a kernel ran"
)
SM_ACTIVE = _activity("gpu_sm_active_ratio", "Fraction of the SMs busy with at least one warp")
SM_OCCUPANCY = _activity("gpu_sm_occupancy_ratio", "Warps resident on the SMs against the most they can hold")
TENSOR_ACTIVE = _activity("gpu_tensor_active_ratio", "Fraction of time the tensor cores worked (any type)")
DRAM_ACTIVE = _activity("gpu_dram_active_ratio", "Device memory bandwidth used against its peak")
FP16_ACTIVE = _activity(
    "gpu_fp16_active_ratio", "Fraction of time the SMs did FP16 math outside tensor cores"
)
FP32_ACTIVE = _activity(
    "gpu_fp32_active_ratio", "Fraction of time the SMs did FP32 math outside tensor cores"
)
FP64_ACTIVE = _activity(
    "gpu_fp64_active_ratio", "Fraction of time the SMs did FP64 math outside tensor cores"
)
NVLINK_TX = gpu_gauge(
    "gpu_nvlink_tx_bytes_per_second", "NVLink bytes sent per second, all links, over the GPM window."
)
NVLINK_RX = gpu_gauge(
    "gpu_nvlink_rx_bytes_per_second", "NVLink bytes received per second, all links, over the GPM window."
)

# NVML_GPM_METRIC_* ids (nvmlGpmMetricId_t, part of the C ABI). Activities come in percent, throughputs
# in MiB/s.
_ACTIVITIES: tuple[tuple[FamilySpec, int], ...] = (
    (GRAPHICS_ACTIVE, 1),  # GRAPHICS_UTIL (DCGM's GR_ENGINE_ACTIVE)
    (SM_ACTIVE, 2),  # SM_UTIL
    (SM_OCCUPANCY, 3),  # SM_OCCUPANCY
    (TENSOR_ACTIVE, 5),  # ANY_TENSOR_UTIL
    (DRAM_ACTIVE, 10),  # DRAM_BW_UTIL
    (FP16_ACTIVE, 13),  # FP16_UTIL
    (FP32_ACTIVE, 12),  # FP32_UTIL
    (FP64_ACTIVE, 11),  # FP64_UTIL
)
_THROUGHPUTS: tuple[tuple[FamilySpec, int], ...] = (
    (PCIE_TX, 20),  # PCIE_TX_PER_SEC
    (PCIE_RX, 21),  # PCIE_RX_PER_SEC
    (NVLINK_RX, 60),  # NVLINK_TOTAL_RX_PER_SEC
    (NVLINK_TX, 61),  # NVLINK_TOTAL_TX_PER_SEC
)
_ACTIVITY_IDS = tuple(metric for _, metric in _ACTIVITIES)
# Throughputs are of the whole GPU's links: a GPU instance is asked for its activities only.
_GPU_IDS = _ACTIVITY_IDS + tuple(metric for _, metric in _THROUGHPUTS)
_MIB = 1 << 20


class GpmCollector:
    name = "gpm"

    def __init__(self, window: float, interval: float) -> None:
        # A window closes at the poll nearest its length, up to half an interval early rather than almost
        # a whole one late: with 1 s polls and a 1 s window, a poll 1 ms early must not double the window.
        self._closes_after = max(window - min(window, interval) / 2, GPM_MIN_SECONDS)

    def collect(self, gpu: GpuContext) -> None:
        if not gpu.has_gpm():
            return
        values = self._window_values(gpu, None, _GPU_IDS)
        self._emit_activities(gpu, values, "")
        for spec, metric in _THROUGHPUTS:
            if metric in values:
                gpu.emit(spec, values[metric] * _MIB)
        instances = _gpu_instances(gpu)
        for instance in sorted(instances):
            self._emit_activities(gpu, self._window_values(gpu, instance, _ACTIVITY_IDS), str(instance))
        state = gpu.device.state(GpmState)
        gone = [key for key in state.buffers if key is not None and key not in instances]
        state.release(gpu.nvml, gpu.index, gone)

    def _window_values(
        self, gpu: GpuContext, instance: int | None, metric_ids: tuple[int, ...]
    ) -> dict[int, float]:
        """The metrics of the GPU, or of one GPU instance, over the last window that closed; {} until one
        has. A window spans only collections that all got this far: after a lost, hung or failed one (a
        reset GPU restarts its counters) a new window opens."""
        buffers = gpm_buffers(gpu, instance)
        if buffers is None:
            return {}
        collection = gpu.device.collections
        if buffers.opened_at is None or buffers.collection != collection - 1:
            buffers.values = {}
            buffers.opened_at = gpu.clock.monotonic() if gpm_sample(gpu, buffers.opened, instance) else None
        elif gpu.clock.monotonic() - buffers.opened_at > self._closes_after:
            if not gpm_sample(gpu, buffers.spare, instance):
                return {}
            closed_at = gpu.clock.monotonic()
            buffers.close_window(closed_at, gpm_metrics(gpu, buffers.opened, buffers.spare, metric_ids))
        buffers.collection = collection
        return buffers.values

    @staticmethod
    def _emit_activities(gpu: GpuContext, values: dict[int, float], instance: str) -> None:
        for spec, metric in _ACTIVITIES:
            if metric in values:
                gpu.emit(spec, values[metric] / 100, instance)


def _gpu_instances(gpu: GpuContext) -> set[int]:
    """The GPU instance ids of a GPU in MIG mode (several MIG devices may share one instance)."""
    mode = gpu.read("nvmlDeviceGetMigMode")
    if not mode or not mode[0]:
        return set()
    found = (gpu.read("nvmlDeviceGetGpuInstanceId", handle=handle) for _, handle in gpu.mig_devices())
    return {instance for instance in found if instance is not None}


def parse_window(value: str) -> float:
    """A duration no shorter than NVML's minimum between two GPM samples."""
    seconds = parse_duration(value)
    if seconds < GPM_MIN_SECONDS:
        raise ValueError(f"{value!r} is shorter than {GPM_MIN_SECONDS * 1000:.0f}ms, NVML's minimum for GPM")
    return seconds


@dataclass(frozen=True)
class GpmSettings:
    """The GPM collector's options, parsed (their defaults are the options')."""

    window: float  # --collector.gpm.window, seconds


register(
    Registration(
        "gpm",
        "SM, tensor and DRAM activity (and PCIe, NVLink bytes/s) from NVML GPM, on GPUs that have it",
        gpu=lambda config, settings, shared: [GpmCollector(settings.window, config.interval)],
        settings=GpmSettings,
        options=(
            Option(
                "--collector.gpm.window",
                "window",
                parse_window,
                "1s",
                "time between the two GPM samples each reading is a ratio over (at least 100ms)",
                metavar="DURATION",
            ),
        ),
    )
)
