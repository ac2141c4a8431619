"""Device efficiency and the host: busy ratio (also next to NVML utilization and the forward passes' share
of wall time), decode bandwidth and prefill FLOPs utilization, and the serving process's CPU."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import PER_MODEL, PER_TARGET

from ..grafana import GREEN, YELLOW, PanelSpec, above, below, steps
from .queries import (
    MODEL_LEGEND,
    alert_settings,
    exporter_instance,
    models_gpu,
    on_models_gpu,
    query,
    serving,
)


def busy_ratio() -> PanelSpec:
    limit = alert_settings("InferwatchHostBound")["busy_ratio_below"]
    busy = promql.aggregate(
        "avg", serving(names.LLM_GPU_BUSY_RATIO), (*PER_MODEL, "device", "uuid", "source")
    )
    return PanelSpec(
        "Device busy ratio",
        "Fraction of wall time the GPU ran the serving process's kernels (NVML: the graphics engine's "
        "activity from GPM, or the GPU's utilization, where it is the GPU's only process; else the "
        "process's own utilization). Below "
        f"{limit:.0%} while requests are in flight (InferwatchHostBound) the GPU waits for the host. "
        "Models on the CPU have none.",
        "percentunit",
        below(limit),
        [query(busy, f"{MODEL_LEGEND} {{{{device}}}} ({{{{source}}}})")],
    )


def busy_ratio_vs_nvml() -> PanelSpec:
    spec = busy_ratio()
    nvml = query(
        on_models_gpu(promql.aggregate("max", models_gpu(names.GPU_UTILIZATION_RATIO), ("uuid", "gpu"))),
        "NVML utilization of {{model}}'s GPU {{gpu}} ({{instance}})",
    )
    forwards = query(
        promql.aggregate("avg", serving(names.LLM_FORWARD_TIME_RATIO), (*PER_MODEL, "device")),
        f"{MODEL_LEGEND} {{{{device}}}} inside forward passes",
    )
    graphics = query(
        on_models_gpu(promql.aggregate("max", models_gpu(names.GPU_GRAPHICS_ACTIVE_RATIO), ("uuid", "gpu"))),
        "graphics engine active on {{model}}'s GPU {{gpu}} ({{instance}})",
    )
    return PanelSpec(
        "Device busy ratio and NVML utilization",
        "The serving process's kernels (busy ratio) next to NVML's view of the model's whole GPU (found by "
        "its UUID) and to the share "
        "of wall time inside the model's forward passes: busy ratio and NVML both low while requests run "
        "means the host is the bottleneck; NVML high but busy ratio low means another process uses the "
        "GPU; forwards high but busy ratio low means the forwards spend their time launching kernels. "
        "The exporter's graphics-engine activity (GPM, Hopper and newer) is the whole GPU's kernel time.",
        spec.unit,
        spec.thresholds,
        [*spec.queries, nvml, graphics, forwards],
    )


def _utilization(metric: str, title: str, description: str) -> PanelSpec:
    return PanelSpec(
        title,
        description,
        "percentunit",
        steps((None, GREEN), (0.8, YELLOW)),
        [
            query(
                promql.aggregate("avg", serving(metric), (*PER_MODEL, "device")),
                f"{MODEL_LEGEND} {{{{device}}}}",
            )
        ],
    )


def decode_bandwidth() -> PanelSpec:
    return _utilization(
        names.LLM_DECODE_BANDWIDTH_UTILIZATION_RATIO,
        "Decode bandwidth utilization",
        "Bytes a decode step must read over its time, as a fraction of peak memory bandwidth. Near the "
        "peak, decode is bandwidth-bound: quantization or batching are the levers.",
    )


def prefill_flops() -> PanelSpec:
    return _utilization(
        names.LLM_PREFILL_FLOPS_UTILIZATION_RATIO,
        "Prefill FLOPs utilization",
        "2 x parameters x prompt tokens over prefill time, as a fraction of peak FLOP/s.",
    )


def serving_process_cpu() -> PanelSpec:
    limit = alert_settings("InferwatchServingProcessCpuSaturated")["cpu_cores_above"]
    return PanelSpec(
        "Serving process CPU",
        f"CPU seconds per second of each serving process (user + system). A Python serving loop is bound "
        f"to one core; InferwatchServingProcessCpuSaturated fires above {limit}.",
        "short",
        above(limit),
        [
            query(
                promql.sum_rate(
                    exporter_instance(names.INFERWATCH_PROCESS_CPU_SECONDS_TOTAL),
                    (*PER_TARGET, "pid", "comm"),
                ),
                "{{comm}} ({{pid}}) {{instance}}",
            )
        ],
    )
