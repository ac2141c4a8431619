"""GPU power, temperature and clocks (NVML): power draw, temperatures against their thresholds, clocks
against their maximum, clocks-event reasons and throttle time, P-state."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import eq, one_of, regex

from ..grafana import GREEN, RED, YELLOW, PanelSpec, above, below, normal, steps
from .queries import alert_settings, gpu, models_gpu, on_models_gpu, query


def power() -> PanelSpec:
    return PanelSpec(
        "Power",
        "Board power draw and the limit the driver enforces; a draw pinned at the limit with clocks below "
        "max is the SW power cap at work.",
        "watt",
        normal(),
        [
            query(gpu(names.GPU_POWER_WATTS), "draw GPU {{gpu}} {{instance}}"),
            query(gpu(names.GPU_POWER_LIMIT_WATTS), "limit GPU {{gpu}} {{instance}}"),
        ],
    )


def temperature() -> PanelSpec:
    return PanelSpec(
        "Temperature",
        "Die and memory temperatures next to the GPU's own slowdown and shutdown thresholds.",
        "celsius",
        steps((None, GREEN), (80, YELLOW), (90, RED)),
        [
            query(gpu(names.GPU_TEMPERATURE_CELSIUS), "{{sensor}} GPU {{gpu}} {{instance}}"),
            query(
                gpu(names.GPU_TEMPERATURE_THRESHOLD_CELSIUS, regex("kind", "slowdown|shutdown")),
                "{{kind}} threshold GPU {{gpu}} {{instance}}",
            ),
        ],
    )


def clocks() -> PanelSpec:
    return PanelSpec(
        "Clocks",
        "SM and memory clocks next to their maximum.",
        "hertz",
        normal(),
        [
            query(gpu(names.GPU_CLOCK_HZ, regex("clock", "sm|memory")), "{{clock}} GPU {{gpu}} {{instance}}"),
            query(
                gpu(names.GPU_CLOCK_MAX_HZ, regex("clock", "sm|memory")),
                "{{clock}} max GPU {{gpu}} {{instance}}",
            ),
        ],
    )


def sm_clock_ratio() -> PanelSpec:
    limit = alert_settings("InferwatchGpuClocksThrottled")["clock_ratio_below"]
    sm = gpu(names.GPU_CLOCK_HZ, eq("clock", "sm"))
    sm_max = gpu(names.GPU_CLOCK_MAX_HZ, eq("clock", "sm"))
    return PanelSpec(
        "SM clock / maximum",
        f"The SM clock as a fraction of its maximum; below {limit:.0%} while busy and with a SW power or "
        "thermal reason active, InferwatchGpuClocksThrottled fires.",
        "percentunit",
        below(limit),
        [query(sm / sm_max, "GPU {{gpu}} {{instance}}")],
    )


def models_gpu_clocks() -> PanelSpec:
    limit = alert_settings("InferwatchGpuClocksThrottled")["clock_ratio_below"]
    duty_reasons = one_of(alert_settings("InferwatchGpuThrottleDutyCycleHigh")["reasons"])
    by_gpu = ("uuid", "gpu")
    sm = promql.aggregate("max", models_gpu(names.GPU_CLOCK_HZ, eq("clock", "sm")), by_gpu)
    sm_max = promql.aggregate("max", models_gpu(names.GPU_CLOCK_MAX_HZ, eq("clock", "sm")), by_gpu)
    held_back = models_gpu(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL, regex("reason", duty_reasons))
    throttled = promql.sum_rate(held_back, by_gpu)
    return PanelSpec(
        "Each model's GPU: SM clock and throttle time",
        "For each selected model, the GPU it runs on (found by its UUID, whatever the model's process calls "
        f"it): its SM clock as a fraction of the maximum (InferwatchGpuClocksThrottled below {limit:.0%}), "
        "and the fraction of time its clocks were held back by power or thermal limits. A model whose "
        "latency rises while this falls is slowed by its GPU, not by its load.",
        "percentunit",
        below(limit),
        [
            query(on_models_gpu(sm / sm_max), "SM clock {{model}} {{instance}} (GPU {{gpu}})"),
            query(on_models_gpu(throttled), "throttled {{model}} {{instance}} (GPU {{gpu}})"),
        ],
    )


def clocks_event_reasons() -> PanelSpec:
    return PanelSpec(
        "Clocks-event reasons",
        "Why clocks are below maximum, one row per GPU and reason: red while the reason holds them back "
        "(gpu_idle is normal when there is no work).",
        "none",
        normal(),
        [
            query(
                promql.aggregate(
                    "max", gpu(names.GPU_CLOCKS_EVENT_ACTIVE), ("job", "instance", "gpu", "reason")
                ),
                "GPU {{gpu}} {{reason}}",
            )
        ],
    )


CLOCKS_EVENT_STATES = {"0": ("-", "transparent"), "1": ("active", RED)}


def throttle_duty_cycle() -> PanelSpec:
    limit = alert_settings("InferwatchGpuThrottleDutyCycleHigh")["duty_cycle_ratio_above"]
    return PanelSpec(
        "Throttle time by reason",
        f"Fraction of time clocks were held back, per reason (NVML violation counters, which also catch "
        f"episodes between polls). InferwatchGpuThrottleDutyCycleHigh fires above {limit:.0%}.",
        "percentunit",
        above(limit),
        [query(promql.rate(gpu(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL)), "GPU {{gpu}} {{reason}}")],
    )


def pstate() -> PanelSpec:
    return PanelSpec(
        "Performance state",
        "P0 is maximum performance; a busy GPU in a higher P-state is held back.",
        "none",
        steps((None, GREEN), (1, YELLOW)),
        [query(gpu(names.GPU_PSTATE), "GPU {{gpu}} {{instance}}")],
    )
