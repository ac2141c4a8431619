"""inferwatch's Prometheus rules, written once as code and filled in from the configuration.

Every alerting rule is a function registered with :func:`alert`: it receives its own slice of the
configuration (:class:`Params`, which also builds selectors) and returns the rule(s) under its name. The
functions hold the expressions and the words; config.yaml holds every number, selector and duration.
:func:`render_rules` turns a validated configuration into the ``groups:`` document Prometheus loads.

Conventions (the monitoring-mixin ones): names are CamelCase with the ``Inferwatch`` prefix, every alert
has ``for:``, a ``severity`` of critical/warning/info and ``summary``/``description``/``runbook_url``
annotations, predictions are ANDed with a check of the current state, and counters are read through
``increase``/``rate`` (never their raw value, which includes events from long ago).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.common.durations import parse_duration

# Labels serving-side series are aggregated by: one series per scrape target and model.
SERVING_BY = "job, instance, model"

GROUP_THROTTLING = "inferwatch-gpu-throttling"
GROUP_LATENCY = "inferwatch-latency"
GROUP_MEMORY = "inferwatch-memory"
GROUP_FAULTS = "inferwatch-gpu-faults"
GROUP_SERVING = "inferwatch-serving"
GROUP_MONITOR = "inferwatch-monitor"
GROUP_RECORDING = "inferwatch-recording"

TTFT = "llm_time_to_first_token_seconds"
ITL = "llm_inter_token_latency_seconds"
E2E = "llm_e2e_request_latency_seconds"
# The SLO alerts and the histogram each one reads.
SLO_HISTOGRAMS = {
    "InferwatchTimeToFirstTokenBudgetBurn": TTFT,
    "InferwatchInterTokenLatencyBudgetBurn": ITL,
}


def promql(text: str) -> str:
    """An expression written as an indented block in the source, as it should read in the YAML."""
    return textwrap.dedent(text).strip()


def num(value: float) -> str:
    """A number as PromQL reads it, without float noise (0.144, not 0.14400000000000002)."""
    return format(value, ".12g")


def one_of(values: list[Any]) -> str:
    """A regex alternation for a ``=~`` matcher."""
    return "|".join(str(v) for v in values)


def bucket_bound(value: float) -> str:
    """A ``le`` regex matching a bucket bound however the client formatted it: Python clients write
    ``1.0``, Go clients ``1``."""
    forms = dict.fromkeys([repr(float(value)), num(value)])
    return "|".join(form.replace(".", "\\\\.") for form in forms)


def label(name: str) -> str:
    """An annotation template reference to one of the alert's labels."""
    return "{{ $labels." + name + " }}"


VALUE = "{{ $value | humanize }}"
VALUE_PERCENT = "{{ $value | humanizePercentage }}"
VALUE_BYTES = "{{ $value | humanize1024 }}B"
VALUE_DURATION = "{{ $value | humanizeDuration }}"
GPU = f"GPU {label('gpu')} ({label('uuid')}) on {label('instance')}"
MODEL = f"model {label('model')} on {label('instance')}"


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule as Prometheus loads it."""

    name: str
    expr: str
    severity: str
    for_: str
    summary: str
    description: str
    runbook_url: str
    labels: Mapping[str, str]

    def to_yaml(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": self.runbook_url,
            },
        }


class Params:
    """One alert's configuration values, with the selectors every expression is built from."""

    def __init__(self, name: str, config: Mapping[str, Any]) -> None:
        self.name = name
        self.values: Mapping[str, Any] = config["alerts"][name]
        self.selectors: Mapping[str, str] = config["selectors"]
        self.runbook_url = f"{config['runbook_url']}#{name.lower()}"

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def serving(self, metric: str, *matchers: str) -> str:
        """``metric`` from instrumented serving processes, narrowed by ``matchers``."""
        return _selector(metric, self.selectors["serving"], matchers)

    def exporter(self, metric: str, *matchers: str) -> str:
        """``metric`` from inferwatch-exporter, narrowed by ``matchers``."""
        return _selector(metric, self.selectors["exporter"], matchers)

    def rule(
        self,
        expr: str,
        summary: str,
        description: str,
        *,
        values: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AlertRule:
        """The rule, with severity and ``for`` from ``values`` (default: the alert's own)."""
        values = self.values if values is None else values
        return AlertRule(
            name=self.name,
            expr=expr,
            severity=values["severity"],
            for_=values["for"],
            summary=summary,
            description=description,
            runbook_url=self.runbook_url,
            labels=labels or {},
        )


def _selector(metric: str, configured: str, matchers: tuple[str, ...]) -> str:
    parts = [m for m in (configured.strip().rstrip(","), *matchers) if m]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


AlertBuilder = Callable[[Params], list[AlertRule]]
# Alert name -> (rule group, builder), in the order they are rendered.
ALERTS: dict[str, tuple[str, AlertBuilder]] = {}


def alert(name: str, group: str) -> Callable[[AlertBuilder], AlertBuilder]:
    """Register the function that builds alert ``name`` (its settings are ``alerts.<name>``)."""

    def register(builder: AlertBuilder) -> AlertBuilder:
        if name in ALERTS:
            raise ValueError(f"alert {name} is defined twice")
        ALERTS[name] = (group, builder)
        return builder

    return register


# ------------------------------------------------------------------------------------------ recording rules


def quantile_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) quantiles of histogram ``metric``."""
    return f"instance_model:{metric}:quantile_rate{window}"


def mean_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) mean of histogram ``metric``."""
    return f"instance_model:{metric}:mean_rate{window}"


def slo_error_record(metric: str, window: str) -> str:
    """Name of the recorded fraction of ``metric`` observations above the SLO target, per (job, model)."""
    return f"job_model:{metric}:slo_error_ratio_rate{window}"


def recording_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recording rules: latency quantiles and means per model, and the SLO error ratios."""
    serving = config["selectors"]["serving"]
    rec = config["recording"]
    window = rec["quantile_window"]
    rules: list[dict[str, Any]] = []
    for metric in (TTFT, ITL, E2E):
        buckets = _selector(f"{metric}_bucket", serving, ())
        for quantile in rec["quantiles"]:
            rules.append(
                {
                    "record": quantile_record(metric, window),
                    "expr": promql(f"""
                        histogram_quantile({num(quantile)},
                          sum by ({SERVING_BY}, le) (rate({buckets}[{window}]))
                        )
                    """),
                    "labels": {"quantile": num(quantile)},
                }
            )
    mean_window = config["alerts"]["InferwatchLatencyFluctuation"]["mean_window"]
    rules.append(
        {
            "record": mean_record(ITL, mean_window),
            "expr": _ratio_of_rates(
                _selector(f"{ITL}_sum", serving, ()), _selector(f"{ITL}_count", serving, ()), mean_window
            ),
        }
    )
    for alert_name, metric in SLO_HISTOGRAMS.items():
        settings = config["alerts"][alert_name]
        if not settings["enabled"]:
            continue
        good = _selector(f"{metric}_bucket", serving, (f'le=~"{bucket_bound(settings["target_seconds"])}"',))
        total = _selector(f"{metric}_count", serving, ())
        windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
        for slo_window in sorted(windows, key=lambda window: parse_duration(window, promql=True)):
            rules.append(
                {
                    "record": slo_error_record(metric, slo_window),
                    "expr": promql(f"""
                        1 - (
                          sum by (job, model) (rate({good}[{slo_window}]))
                          /
                          sum by (job, model) (rate({total}[{slo_window}]))
                        )
                    """),
                }
            )
    return rules


def events_above(counter: str, window: str, threshold: float, by: str | None = None) -> str:
    """Counter ``counter`` rose by more than ``threshold`` over ``window``, optionally summed ``by``.

    A counter whose label set is created at its first event (an XID code, an error kind) appears with
    value 1, a rise that increase() cannot see; so a series that did not exist ``window`` ago counts
    from zero, in a second branch. (When a group has both kinds, each branch is judged on its own.)
    """
    new = f"({counter} unless {counter} offset {window})"
    increase = f"increase({counter}[{window}])"
    if by is not None:
        new, increase = f"sum by ({by}) {new}", f"sum by ({by}) ({increase})"
    return f"{increase} > {num(threshold)}\nor\n{new} > {num(threshold)}"


def _ratio_of_rates(numerator: str, denominator: str, window: str) -> str:
    """Per (job, instance, model): rate of ``numerator`` over rate of ``denominator``."""
    return promql(f"""
        sum by ({SERVING_BY}) (rate({numerator}[{window}]))
        /
        sum by ({SERVING_BY}) (rate({denominator}[{window}]))
    """)


# ------------------------------------------------------------------------------------------------ throttling


@alert("InferwatchGpuHardwareSlowdown", GROUP_THROTTLING)
def _gpu_hardware_slowdown(p: Params) -> list[AlertRule]:
    active = p.exporter("gpu_clocks_event_active", f'reason=~"{one_of(p["reasons"])}"')
    return [
        p.rule(
            f"{active} == 1",
            f"{GPU} is in hardware slowdown ({label('reason')}).",
            f"{GPU} has reported clocks-event reason {label('reason')} for more than {p['for']}: the "
            "hardware itself cut the clocks (overheating, a power brake from the board or the power "
            "supply), so every kernel on it runs slower and latency rises for every model it serves.",
        )
    ]


@alert("InferwatchGpuClocksThrottled", GROUP_THROTTLING)
def _gpu_clocks_throttled(p: Params) -> list[AlertRule]:
    clock = p.exporter("gpu_clock_hz", 'clock="sm"')
    max_clock = p.exporter("gpu_clock_max_hz", 'clock="sm"')
    busy = p.exporter("gpu_utilization_ratio")
    active = p.exporter("gpu_clocks_event_active", f'reason=~"{one_of(p["reasons"])}"')
    expr = promql(f"""
        (
          {clock} / {max_clock} < {num(p["clock_ratio_below"])}
        )
        and on (job, instance, gpu)
          ({busy} > {num(p["utilization_ratio_above"])})
        and on (job, instance, gpu)
          (max by (job, instance, gpu) ({active}) == 1)
    """)
    return [
        p.rule(
            expr,
            f"{GPU} runs at {VALUE_PERCENT} of its maximum SM clock while busy.",
            f"{GPU} has been held below {num(p['clock_ratio_below'] * 100)}% of its maximum SM clock by "
            f"the driver ({one_of(p['reasons'])}) for more than {p['for']} while more than "
            f"{num(p['utilization_ratio_above'] * 100)}% utilized: it is power- or thermally limited, "
            "and tokens come out slower than the hardware allows.",
        )
    ]


@alert("InferwatchGpuThrottleDutyCycleHigh", GROUP_THROTTLING)
def _gpu_throttle_duty_cycle(p: Params) -> list[AlertRule]:
    seconds = p.exporter("gpu_clocks_event_seconds_total", f'reason=~"{one_of(p["reasons"])}"')
    window = p["window"]
    return [
        p.rule(
            f"rate({seconds}[{window}]) > {num(p['duty_cycle_ratio_above'])}",
            f"{GPU} spends {VALUE_PERCENT} of its time throttled by {label('reason')}.",
            f"{GPU} was throttled by {label('reason')} for {VALUE_PERCENT} of the last {window} "
            f"(threshold {num(p['duty_cycle_ratio_above'] * 100)}%), for more than {p['for']}. "
            "Sustained throttling makes latency depend on the GPU's temperature and power draw instead "
            "of on the workload.",
        )
    ]


@alert("InferwatchGpuTemperatureNearSlowdown", GROUP_THROTTLING)
def _gpu_temperature_near_slowdown(p: Params) -> list[AlertRule]:
    threshold = p.exporter("gpu_temperature_threshold_celsius", 'kind="slowdown"')
    temperature = p.exporter("gpu_temperature_celsius", 'sensor="gpu"')
    expr = promql(f"""
        {threshold}
          - ignoring (kind, sensor)
        {temperature}
          < {num(p["margin_celsius_below"])}
    """)
    return [
        p.rule(
            expr,
            f"{GPU} is within {VALUE} °C of its slowdown temperature.",
            f"{GPU} has been less than {num(p['margin_celsius_below'])} °C below its own slowdown "
            f"threshold for more than {p['for']} ({VALUE} °C left). Past that threshold the hardware cuts "
            "its clocks; check cooling, airflow and fans now.",
        )
    ]


# ------------------------------------------------------------------------------------- latency and errors


@alert("InferwatchLatencyFluctuation", GROUP_LATENCY)
def _latency_fluctuation(p: Params) -> list[AlertRule]:
    mean = mean_record(ITL, p["mean_window"])
    window = p["window"]
    tokens = p.serving(f"{ITL}_count")
    expr = promql(f"""
        (
          stddev_over_time({mean}[{window}])
          /
          avg_over_time({mean}[{window}])
        ) > {num(p["coefficient_of_variation_above"])}
        and on ({SERVING_BY})
          sum by ({SERVING_BY}) (rate({tokens}[{window}])) > {num(p["min_tokens_per_second"])}
    """)
    return [
        p.rule(
            expr,
            f"Inter-token latency of {MODEL} fluctuates by {VALUE_PERCENT}.",
            f"The mean inter-token latency of {MODEL} per {p['mean_window']} varied with a coefficient of "
            f"variation of {VALUE_PERCENT} over the last {window} (threshold "
            f"{num(p['coefficient_of_variation_above'] * 100)}%), for more than {p['for']}. The same "
            "workload should run at a steady speed: look for throttled clocks, other processes on the "
            "GPU or CPU, and a CPU-bound input pipeline.",
        )
    ]


def _budget_burn(p: Params, metric: str, what: str) -> list[AlertRule]:
    budget = 1 - p["objective_ratio"]
    rules = []
    for speed in ("fast", "slow"):
        settings = p[speed]
        long_window, short_window = settings["long_window"], settings["short_window"]
        threshold = num(settings["burn_rate"] * budget)
        expr = promql(f"""
            {slo_error_record(metric, long_window)} > {threshold}
            and
            {slo_error_record(metric, short_window)} > {threshold}
        """)
        rules.append(
            p.rule(
                expr,
                f"{what} of model {label('model')} ({label('job')}) burns its error budget "
                f"{num(settings['burn_rate'])} times too fast.",
                f"{VALUE_PERCENT} of {what.lower()}s of model {label('model')} took longer than "
                f"{num(p['target_seconds'])}s over the last {long_window} (and over the last "
                f"{short_window}); the objective allows {num(budget * 100)}%. At this rate the error "
                "budget of the SLO is spent early.",
                values=settings,
                labels={"long_window": long_window, "short_window": short_window},
            )
        )
    return rules


@alert("InferwatchTimeToFirstTokenBudgetBurn", GROUP_LATENCY)
def _ttft_budget_burn(p: Params) -> list[AlertRule]:
    return _budget_burn(p, TTFT, "Time to first token")


@alert("InferwatchInterTokenLatencyBudgetBurn", GROUP_LATENCY)
def _itl_budget_burn(p: Params) -> list[AlertRule]:
    return _budget_burn(p, ITL, "Inter-token latency")


@alert("InferwatchRequestErrors", GROUP_LATENCY)
def _request_errors(p: Params) -> list[AlertRule]:
    failed = p.serving("llm_requests_total", 'status!="ok"')
    everything = p.serving("llm_requests_total")
    window = p["window"]
    ratio = textwrap.indent(_ratio_of_rates(failed, everything, window), "  ")
    expr = f"(\n{ratio}\n) > {num(p['error_ratio_above'])}"
    return [
        p.rule(
            expr,
            f"{VALUE_PERCENT} of requests to {MODEL} fail.",
            f"{VALUE_PERCENT} of the requests to {MODEL} ended in an error or out-of-memory over the "
            f"last {window} (threshold {num(p['error_ratio_above'] * 100)}%), for more than {p['for']}.",
        )
    ]


# ---------------------------------------------------------------------------------------------- OOM risk


@alert("InferwatchKvCacheHeadroomLow", GROUP_MEMORY)
def _kv_cache_headroom_low(p: Params) -> list[AlertRule]:
    headroom = p.serving("llm_kv_cache_headroom_tokens")
    return [
        p.rule(
            f"{headroom} < {num(p['headroom_tokens_below'])}",
            f"Only {VALUE} more KV-cache tokens fit on the device of {MODEL}.",
            f"Free device memory of {MODEL} holds only {VALUE} more tokens of KV cache (threshold "
            f"{num(p['headroom_tokens_below'])}), for more than {p['for']}: a longer prompt or a bigger "
            "batch runs out of memory.",
        )
    ]


@alert("InferwatchGpuMemoryFillingUp", GROUP_MEMORY)
def _gpu_memory_filling_up(p: Params) -> list[AlertRule]:
    used = p.exporter("gpu_memory_used_bytes")
    total = p.exporter("gpu_memory_total_bytes")
    horizon = p["horizon_window"]
    expr = promql(f"""
        (
          predict_linear({used}[{p["window"]}], {num(parse_duration(horizon, promql=True))})
            > {total}
        )
        and
        (
          {used} / {total} > {num(p["used_ratio_above"])}
        )
    """)
    return [
        p.rule(
            expr,
            f"{GPU} runs out of memory within {horizon} at the current rate.",
            f"Used memory of {GPU} is above {num(p['used_ratio_above'] * 100)}% and its trend over the "
            f"last {p['window']} reaches {VALUE_BYTES}, more than the device holds, within {horizon}.",
        )
    ]


@alert("InferwatchAllocatorRetries", GROUP_MEMORY)
def _allocator_retries(p: Params) -> list[AlertRule]:
    retries = p.serving("llm_torch_alloc_retries_total")
    window = p["window"]
    return [
        p.rule(
            f"increase({retries}[{window}]) > {num(p['retries_above'])}",
            f"The CUDA allocator on {label('device')} of {label('instance')} keeps retrying allocations.",
            f"torch's caching allocator on {label('device')} of {label('instance')} freed its cache and "
            f"retried a failed allocation {VALUE} times in the last {window} (threshold "
            f"{num(p['retries_above'])}). Each retry stalls the step; it is the early sign of an "
            "out-of-memory error.",
        )
    ]


@alert("InferwatchOutOfMemory", GROUP_MEMORY)
def _out_of_memory(p: Params) -> list[AlertRule]:
    ooms = p.serving("llm_oom_events_total")
    window = p["window"]
    return [
        p.rule(
            f"increase({ooms}[{window}]) > 0",
            f"{MODEL} ran out of device memory.",
            f"Out-of-memory errors raised by {MODEL} in the last {window}: {VALUE}. The requests that "
            "hit them failed.",
        )
    ]


@alert("InferwatchMemoryLeak", GROUP_MEMORY)
def _memory_leak(p: Params) -> list[AlertRule]:
    allocated = p.serving("llm_torch_memory_bytes", 'kind="allocated"')
    tokens = p.serving("llm_generation_tokens_total")
    floor, lookback = p["floor_window"], p["lookback"]
    load_now = f"sum by (job, instance) (rate({tokens}[{floor}]))"
    load_before = f"sum by (job, instance) (rate({tokens}[{floor}] offset {lookback}))"
    expr = promql(f"""
        (
          min_over_time({allocated}[{floor}])
            - min_over_time({allocated}[{floor}] offset {lookback})
        ) > {num(p["growth_bytes_above"])}
        and on (job, instance)
        (
          {load_now}
            <= {num(1 + p["load_growth_ratio"])} * {load_before}
        )
    """)
    return [
        p.rule(
            expr,
            f"Allocated memory on {label('device')} of {label('instance')} creeps up without more load.",
            f"The lowest allocated memory on {label('device')} of {label('instance')} over {floor} grew "
            f"by {VALUE_BYTES} in {lookback}, while the token rate did not rise by more than "
            f"{num(p['load_growth_ratio'] * 100)}%: memory that is not released between requests (a "
            "leak) ends in an out-of-memory error.",
        )
    ]


# -------------------------------------------------------------------------------------------------- faults


@alert("InferwatchGpuXidError", GROUP_FAULTS)
def _gpu_xid_error(p: Params) -> list[AlertRule]:
    xids = p.exporter("gpu_xid_errors_total", f'xid=~"{one_of(p["xids"])}"')
    window = p["window"]
    return [
        p.rule(
            events_above(xids, window, 0),
            f"{GPU} reported XID {label('xid')}.",
            f"{GPU} reported XID {label('xid')} {VALUE} times in the last {window}. This XID means a "
            "hardware, driver or firmware fault; the GPU may need a reset or service.",
        )
    ]


@alert("InferwatchGpuUncorrectableEccErrors", GROUP_FAULTS)
def _gpu_uncorrectable_ecc(p: Params) -> list[AlertRule]:
    # Volatile counts move at once; aggregate ones count the same errors again, later.
    errors = p.exporter("gpu_ecc_errors_total", 'type="uncorrected"', 'scope="volatile"')
    window = p["window"]
    return [
        p.rule(
            f"increase({errors}[{window}]) > 0",
            f"{GPU} had uncorrectable ECC errors.",
            f"{GPU} counted {VALUE} uncorrectable ECC errors in the last {window}. "
            "Data in device memory was corrupted; processes using it may have crashed or computed "
            "wrong results.",
        )
    ]


@alert("InferwatchGpuRowRemapFailure", GROUP_FAULTS)
def _gpu_row_remap_failure(p: Params) -> list[AlertRule]:
    failure = p.exporter("gpu_remapped_rows_failed")
    return [
        p.rule(
            f"{failure} == 1",
            f"{GPU} failed to remap a memory row.",
            f"{GPU} reports a row-remapping failure: a bad memory row could not be replaced by a spare. "
            "The GPU needs service.",
        )
    ]


@alert("InferwatchGpuRowRemapPending", GROUP_FAULTS)
def _gpu_row_remap_pending(p: Params) -> list[AlertRule]:
    pending = p.exporter("gpu_remapped_rows_pending")
    return [
        p.rule(
            f"{pending} == 1",
            f"{GPU} needs a reset to remap a memory row.",
            f"{GPU} has had a row remapping pending for more than {p['for']}: it takes effect at the next "
            "GPU reset, until then the bad row is still in use.",
        )
    ]


@alert("InferwatchGpuLost", GROUP_FAULTS)
def _gpu_lost(p: Params) -> list[AlertRule]:
    up = p.exporter("gpu_up")
    return [
        p.rule(
            f"{up} == 0",
            f"{GPU} does not answer.",
            f"The exporter could not read {GPU} for more than {p['for']}: it fell off the bus, hung, or "
            "NVML fails on it.",
        )
    ]


@alert("InferwatchGpuCountDropped", GROUP_FAULTS)
def _gpu_count_dropped(p: Params) -> list[AlertRule]:
    info = p.exporter("gpu_info")
    up = p.exporter("up")
    lookback = p["lookback"]
    expr = promql(f"""
        (
          count by (job, instance) ({info})
            or on (job, instance) 0 * ({up} == 1)
        )
        < max_over_time(count by (job, instance) ({info})[{lookback}:5m])
    """)
    return [
        p.rule(
            expr,
            f"{label('instance')} sees fewer GPUs than before.",
            f"{label('instance')} now sees {VALUE} GPUs, fewer than it saw at some point in the last "
            f"{lookback}: a GPU fell off the bus or the driver no longer enumerates it.",
        )
    ]


# -------------------------------------------------------------------------------------------- host-bound


@alert("InferwatchHostBound", GROUP_SERVING)
def _host_bound(p: Params) -> list[AlertRule]:
    busy = p.serving("llm_gpu_busy_ratio")
    running = p.serving("llm_requests_running")
    window = p["window"]
    expr = promql(f"""
        {busy} < {num(p["busy_ratio_below"])}
        and on ({SERVING_BY})
          avg_over_time({running}[{window}]) > {num(p["requests_running_above"])}
    """)
    return [
        p.rule(
            expr,
            f"{MODEL} keeps its device busy only {VALUE_PERCENT} of the time while serving.",
            f"The forward passes of {MODEL} occupied {label('device')} for only {VALUE_PERCENT} of wall "
            f"time (threshold {num(p['busy_ratio_below'] * 100)}%) while requests were in flight, for "
            f"more than {p['for']}. The device waits for the host: Python overhead, tokenization, "
            "sampling or data loading sit between the kernels.",
        )
    ]


@alert("InferwatchServingProcessCpuSaturated", GROUP_SERVING)
def _serving_cpu_saturated(p: Params) -> list[AlertRule]:
    cpu = p.exporter("inferwatch_process_cpu_seconds_total")
    window = p["window"]
    process = f"Serving process {label('comm')} (pid {label('pid')}) on {label('instance')}"
    return [
        p.rule(
            f"sum by (job, instance, pid, comm) (rate({cpu}[{window}])) > {num(p['cpu_cores_above'])}",
            f"{process} uses {VALUE} CPU cores.",
            f"{process} used {VALUE} CPU seconds per second (user and system) over the "
            f"last {window} (threshold {num(p['cpu_cores_above'])}): a Python serving loop is bound to one "
            "core, so the host, not the GPU, limits throughput.",
        )
    ]


@alert("InferwatchEngineStalled", GROUP_SERVING)
def _engine_stalled(p: Params) -> list[AlertRule]:
    last_step = p.serving("llm_last_step_timestamp_seconds")
    running = p.serving("llm_requests_running")
    expr = promql(f"""
        time() - {last_step} > {num(p["stall_seconds_above"])}
        and on ({SERVING_BY})
          {running} > 0
    """)
    return [
        p.rule(
            expr,
            f"{MODEL} has made no progress for {VALUE_DURATION}.",
            f"{MODEL} has requests in flight but ran no forward pass for {VALUE_DURATION} (threshold "
            f"{num(p['stall_seconds_above'])}s): the engine is hung.",
        )
    ]


# -------------------------------------------------------------------------------------- the monitor itself


@alert("InferwatchTargetDown", GROUP_MONITOR)
def _target_down(p: Params) -> list[AlertRule]:
    return [
        p.rule(
            f"{p.exporter('up')} == 0 or {p.serving('up')} == 0",
            f"Prometheus cannot scrape {label('job')} at {label('instance')}.",
            f"Scrapes of {label('instance')} (job {label('job')}) have failed for more than {p['for']}: "
            "its metrics, and every alert that reads them, are blind.",
        )
    ]


@alert("InferwatchTargetAbsent", GROUP_MONITOR)
def _target_absent(p: Params) -> list[AlertRule]:
    return [
        p.rule(
            f"absent({p.exporter('up')}) or absent({p.serving('up')})",
            f"No scrape target of job {label('job')} exists.",
            f"Prometheus has had no target of job {label('job')} for more than {p['for']}: service "
            "discovery lost it or the job was renamed, and the alerts that read it cannot fire.",
        )
    ]


@alert("InferwatchExporterCollectionStale", GROUP_MONITOR)
def _exporter_collection_stale(p: Params) -> list[AlertRule]:
    last = p.exporter("inferwatch_exporter_last_collect_timestamp_seconds")
    return [
        p.rule(
            f"time() - {last} > {num(p['age_seconds_above'])}",
            f"The exporter on {label('instance')} serves data {VALUE_DURATION} old.",
            f"The last complete collection of the exporter on {label('instance')} finished "
            f"{VALUE_DURATION} ago (threshold {num(p['age_seconds_above'])}s): its series are stale, "
            "probably because NVML hangs.",
        )
    ]


@alert("InferwatchExporterCollectionSlow", GROUP_MONITOR)
def _exporter_collection_slow(p: Params) -> list[AlertRule]:
    overruns = p.exporter("inferwatch_exporter_collection_overruns_total")
    window = p["window"]
    return [
        p.rule(
            f"increase({overruns}[{window}]) > {num(p['overruns_above'])}",
            f"Collections of the exporter on {label('instance')} take longer than its interval.",
            f"{VALUE} collections of the exporter on {label('instance')} were still running when the "
            f"next was due in the last {window} (threshold {num(p['overruns_above'])}): readings arrive "
            "late and less often than configured.",
        )
    ]


@alert("InferwatchNvmlDown", GROUP_MONITOR)
def _nvml_down(p: Params) -> list[AlertRule]:
    up = p.exporter("inferwatch_nvml_up")
    return [
        p.rule(
            f"{up} == 0",
            f"The exporter on {label('instance')} cannot use NVML.",
            f"NVML has not been initialised in the exporter on {label('instance')} for more than "
            f"{p['for']}: no GPU metric is collected (driver missing, not mounted into the container, or "
            "the driver/library versions differ).",
        )
    ]


@alert("InferwatchNvmlErrors", GROUP_MONITOR)
def _nvml_errors(p: Params) -> list[AlertRule]:
    errors = p.exporter("inferwatch_exporter_nvml_errors_total", 'error!="not_supported"')
    window = p["window"]
    return [
        p.rule(
            events_above(errors, window, p["errors_above"], by="job, instance, call"),
            f"NVML call {label('call')} keeps failing on {label('instance')}.",
            f"NVML call {label('call')} failed {VALUE} times in the last {window} on {label('instance')} "
            f"(threshold {num(p['errors_above'])}); the series it feeds are missing.",
        )
    ]


@alert("InferwatchInstrumentationErrors", GROUP_MONITOR)
def _instrumentation_errors(p: Params) -> list[AlertRule]:
    errors = p.serving("llm_instrumentation_errors_total")
    window = p["window"]
    return [
        p.rule(
            events_above(errors, window, p["errors_above"], by="job, instance, stage"),
            f"inferwatch's instrumentation fails at {label('stage')} on {label('instance')}.",
            f"The instrumentation in the serving process on {label('instance')} caught {VALUE} errors "
            f"at stage {label('stage')} in the last {window}. The model kept running, but the metrics "
            "of that stage are incomplete.",
        )
    ]


# ---------------------------------------------------------------------------------------------- rendering


def render_rules(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rule file for ``config`` (already validated): recording rules, then one group per topic."""
    groups: dict[str, list[dict[str, Any]]] = {GROUP_RECORDING: recording_rules(config)}
    for name, (group, builder) in ALERTS.items():
        if not config["alerts"][name]["enabled"]:
            continue
        rules = groups.setdefault(group, [])
        rules.extend(rule.to_yaml() for rule in builder(Params(name, config)))
    return {"groups": [{"name": name, "rules": rules} for name, rules in groups.items() if rules]}
