"""GPU power, temperature and clocks (NVML): power draw, temperatures against their thresholds, clocks
against their maximum, clocks-event reasons and throttle time, P-state."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import GREEN, RATE, RED, YELLOW, PanelSpec, Query, above, below, normal, steps
from .queries import GPU, MODELS_GPU, alert_settings, on_models_gpu, sel


def power() -> PanelSpec:
    return PanelSpec(
        "Power",
        "Board power draw and the limit the driver enforces; a draw pinned at the limit with clocks below "
        "max is the SW power cap at work.",
        "watt",
        normal(),
        [
            Query(sel(names.GPU_POWER_WATTS, GPU), "draw GPU {{gpu}} {{instance}}"),
            Query(sel(names.GPU_POWER_LIMIT_WATTS, GPU), "limit GPU {{gpu}} {{instance}}"),
        ],
    )


def temperature() -> PanelSpec:
    return PanelSpec(
        "Temperature",
        "Die and memory temperatures next to the GPU's own slowdown and shutdown thresholds.",
        "celsius",
        steps((None, GREEN), (80, YELLOW), (90, RED)),
        [
            Query(sel(names.GPU_TEMPERATURE_CELSIUS, GPU), "{{sensor}} GPU {{gpu}} {{instance}}"),
            Query(
                sel(names.GPU_TEMPERATURE_THRESHOLD_CELSIUS, GPU, 'kind=~"slowdown|shutdown"'),
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
            Query(sel(names.GPU_CLOCK_HZ, GPU, 'clock=~"sm|memory"'), "{{clock}} GPU {{gpu}} {{instance}}"),
            Query(
                sel(names.GPU_CLOCK_MAX_HZ, GPU, 'clock=~"sm|memory"'),
                "{{clock}} max GPU {{gpu}} {{instance}}",
            ),
        ],
    )


def sm_clock_ratio() -> PanelSpec:
    limit = alert_settings("InferwatchGpuClocksThrottled")["clock_ratio_below"]
    sm = sel(names.GPU_CLOCK_HZ, GPU, 'clock="sm"')
    sm_max = sel(names.GPU_CLOCK_MAX_HZ, GPU, 'clock="sm"')
    return PanelSpec(
        "SM clock / maximum",
        f"The SM clock as a fraction of its maximum; below {limit:.0%} while busy and with a SW power or "
        "thermal reason active, InferwatchGpuClocksThrottled fires.",
        "percentunit",
        below(limit),
        [Query(f"{sm} / {sm_max}", "GPU {{gpu}} {{instance}}")],
    )


def models_gpu_clocks() -> PanelSpec:
    limit = alert_settings("InferwatchGpuClocksThrottled")["clock_ratio_below"]
    duty_reasons = "|".join(alert_settings("InferwatchGpuThrottleDutyCycleHigh")["reasons"])
    sm = sel(names.GPU_CLOCK_HZ, MODELS_GPU, 'clock="sm"')
    sm_max = sel(names.GPU_CLOCK_MAX_HZ, MODELS_GPU, 'clock="sm"')
    share = f"(max by (uuid, gpu) ({sm}) / max by (uuid, gpu) ({sm_max}))"
    held_back = sel(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL, MODELS_GPU, f'reason=~"{duty_reasons}"')
    throttled = f"sum by (uuid, gpu) (rate({held_back}[{RATE}]))"
    return PanelSpec(
        "Each model's GPU: SM clock and throttle time",
        "For each selected model, the GPU it runs on (found by its UUID, whatever the model's process calls "
        f"it): its SM clock as a fraction of the maximum (InferwatchGpuClocksThrottled below {limit:.0%}), "
        "and the fraction of time its clocks were held back by power or thermal limits. A model whose "
        "latency rises while this falls is slowed by its GPU, not by its load.",
        "percentunit",
        below(limit),
        [
            Query(on_models_gpu(share), "SM clock {{model}} (GPU {{gpu}})"),
            Query(on_models_gpu(throttled), "throttled {{model}} (GPU {{gpu}})"),
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
            Query(
                f"max by (instance, gpu, reason) ({sel(names.GPU_CLOCKS_EVENT_ACTIVE, GPU)})",
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
        [
            Query(
                f"rate({sel(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL, GPU)}[{RATE}])",
                "GPU {{gpu}} {{reason}}",
            )
        ],
    )


def pstate() -> PanelSpec:
    return PanelSpec(
        "Performance state",
        "P0 is maximum performance; a busy GPU in a higher P-state is held back.",
        "none",
        steps((None, GREEN), (1, YELLOW)),
        [Query(sel(names.GPU_PSTATE, GPU), "GPU {{gpu}} {{instance}}")],
    )
