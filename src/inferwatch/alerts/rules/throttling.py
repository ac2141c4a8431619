"""GPU throttling: hardware slowdown, clocks held down while busy, throttle duty cycle, temperature
near slowdown (``gpu_*`` from the exporter)."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import eq, num, one_of, regex

from .base import GPU, VALUE, VALUE_PERCENT, AlertGroup, AlertRule, Params, label

# A GPU's series match on these labels.
ON_GPU = ("job", "instance", "gpu")

GROUP = AlertGroup("inferwatch-gpu-throttling")


@GROUP.alert("InferwatchGpuHardwareSlowdown")
def _gpu_hardware_slowdown(p: Params) -> list[AlertRule]:
    active = p.exporter(names.GPU_CLOCKS_EVENT_ACTIVE, regex("reason", one_of(p["reasons"])))
    return [
        p.rule(
            active.eq(1),
            f"{GPU} is in hardware slowdown ({label('reason')}).",
            f"{GPU} has reported clocks-event reason {label('reason')} for more than {p['for']}: the "
            "hardware itself cut the clocks (overheating, a power brake from the board or the power "
            "supply), so every kernel on it runs slower and latency rises for every model it serves. "
            + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuClocksThrottled")
def _gpu_clocks_throttled(p: Params) -> list[AlertRule]:
    clock = p.exporter(names.GPU_CLOCK_HZ, eq("clock", "sm"))
    max_clock = p.exporter(names.GPU_CLOCK_MAX_HZ, eq("clock", "sm"))
    busy = p.exporter(names.GPU_UTILIZATION_RATIO)
    active = p.exporter(names.GPU_CLOCKS_EVENT_ACTIVE, regex("reason", one_of(p["reasons"])))
    expr = (
        (clock / max_clock)
        .lt(p["clock_ratio_below"])
        .and_(busy.gt(p["utilization_ratio_above"]), on=ON_GPU)
        .and_(promql.aggregate("max", active, ON_GPU).eq(1), on=ON_GPU)
    )
    return [
        p.rule(
            expr,
            f"{GPU} runs at {VALUE_PERCENT} of its maximum SM clock while busy.",
            f"{GPU} has been held below {num(p['clock_ratio_below'] * 100)}% of its maximum SM clock by "
            f"the driver ({one_of(p['reasons'])}) for more than {p['for']} while more than "
            f"{num(p['utilization_ratio_above'] * 100)}% utilized: it is power- or thermally limited, "
            "and tokens come out slower than the hardware allows. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuThrottleDutyCycleHigh")
def _gpu_throttle_duty_cycle(p: Params) -> list[AlertRule]:
    seconds = p.exporter(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL, regex("reason", one_of(p["reasons"])))
    window = p["window"]
    return [
        p.rule(
            promql.rate(seconds, window).gt(p["duty_cycle_ratio_above"]),
            f"{GPU} spends {VALUE_PERCENT} of its time throttled by {label('reason')}.",
            f"{GPU} was throttled by {label('reason')} for {VALUE_PERCENT} of the last {window} "
            f"(threshold {num(p['duty_cycle_ratio_above'] * 100)}%), for more than {p['for']}. "
            "Sustained throttling makes latency depend on the GPU's temperature and power draw instead "
            "of on the workload. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuTemperatureNearSlowdown")
def _gpu_temperature_near_slowdown(p: Params) -> list[AlertRule]:
    threshold = p.exporter(names.GPU_TEMPERATURE_THRESHOLD_CELSIUS, eq("kind", "slowdown"))
    temperature = p.exporter(names.GPU_TEMPERATURE_CELSIUS, eq("sensor", "gpu"))
    margin = threshold.minus(temperature, promql.Matching(("kind", "sensor"), ignoring=True))
    expr = margin.lt(p["margin_celsius_below"])
    return [
        p.rule(
            expr,
            f"{GPU} is within {VALUE} °C of its slowdown temperature.",
            f"{GPU} has been less than {num(p['margin_celsius_below'])} °C below its own slowdown "
            f"threshold for more than {p['for']} ({VALUE} °C left). Past that threshold the hardware cuts "
            "its clocks; check cooling, airflow and fans now. " + p.gpu_users(),
        )
    ]
