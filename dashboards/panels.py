"""Every panel of inferwatch's dashboards, defined once; a dashboard is a choice and order of these.

Query conventions (the ones the anchors' dashboards get wrong):

* percentiles are ``histogram_quantile`` over ``sum by (model, le) (rate(X_bucket[$__rate_interval]))``:
  buckets are summed across instances before the quantile, never quantiles averaged or added;
* means are ``sum(rate(X_sum)) / sum(rate(X_count))``, never an average of per-instance averages;
* every range selector uses ``$__rate_interval``; counters are only read through ``rate``/``increase``.

Thresholds that correspond to an alert come from the alert's default configuration (alerts/config.yaml),
so a panel turns red where the alert would fire.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from inferwatch.alerts.config import default_config

from .grafana import GREEN, RATE, RED, YELLOW, PanelSpec, Query, above, below, normal, steps

# Label matchers every serving-side / per-GPU / per-instance selector carries.
SERVING = 'model=~"$model", instance=~"$instance"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
INSTANCE = 'instance=~"$instance"'

QUANTILES = (0.5, 0.9, 0.99)

TTFT = "llm_time_to_first_token_seconds"
ITL = "llm_inter_token_latency_seconds"
E2E = "llm_e2e_request_latency_seconds"


@cache
def _alert(name: str) -> dict[str, Any]:
    return default_config()["alerts"][name]


def _sel(metric: str, matchers: str, extra: str = "") -> str:
    return f"{metric}{{{matchers}{', ' + extra if extra else ''}}}"


def summed(function: str, metric: str, matchers: str, by: str) -> str:
    """``sum by (by) (function(metric{matchers}[$__rate_interval]))`` for rate or increase."""
    return f"sum by ({by}) ({function}({_sel(metric, matchers)}[{RATE}]))"


def percentile(metric: str, quantile: float, by: str = "model") -> Query:
    """The ``quantile`` of histogram ``metric`` per ``by``, from buckets summed over instances."""
    expr = f"histogram_quantile({quantile}, {summed('rate', metric + '_bucket', SERVING, by + ', le')})"
    return Query(expr, f"p{quantile * 100:g} {{{{{by}}}}}")


def mean(metric: str, by: str = "model", matchers: str = SERVING) -> Query:
    """The mean of histogram ``metric`` per ``by``: summed rate of the sum over summed rate of the count."""
    expr = (
        f"{summed('rate', metric + '_sum', matchers, by)} / {summed('rate', metric + '_count', matchers, by)}"
    )
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return Query(expr, f"mean {legend}")


def _latency(
    metric: str, title: str, description: str, thresholds: list, with_mean: bool = False
) -> PanelSpec:
    queries = [percentile(metric, q) for q in QUANTILES]
    if with_mean:
        queries.append(mean(metric))
    return PanelSpec(title, description, "s", thresholds, queries)


# ------------------------------------------------------------------------------------------------ latency


def time_to_first_token() -> PanelSpec:
    target = _alert("InferwatchTimeToFirstTokenBudgetBurn")["target_seconds"]
    return _latency(
        TTFT,
        "Time to first token",
        f"From entry into generate until the first token is computed on the device. The red line is the "
        f"SLO target ({target} s) of InferwatchTimeToFirstTokenBudgetBurn.",
        above(target),
    )


def inter_token_latency() -> PanelSpec:
    target = _alert("InferwatchInterTokenLatencyBudgetBurn")["target_seconds"]
    return _latency(
        ITL,
        "Inter-token latency",
        f"Time between consecutive tokens of a request, and its mean. The red line is the SLO target "
        f"({target} s) of InferwatchInterTokenLatencyBudgetBurn.",
        above(target),
        with_mean=True,
    )


def end_to_end_latency() -> PanelSpec:
    return _latency(
        E2E,
        "End-to-end latency",
        "Host time from entry into generate to its return, per successful request. It grows with the "
        "number of generated tokens; compare it with the per-token panels before calling it slow.",
        normal(),
    )


def per_request_token_time() -> PanelSpec:
    return PanelSpec(
        "Time per output token and worst stall",
        "Per request: the mean time per output token after the first, and the longest single gap between "
        "two tokens (p99 over requests). A worst stall far above the mean is a hiccup, not a slow model.",
        "s",
        above(_alert("InferwatchInterTokenLatencyBudgetBurn")["target_seconds"]),
        [
            percentile("llm_request_time_per_output_token_seconds", 0.5),
            percentile("llm_request_time_per_output_token_seconds", 0.99),
            Query(
                percentile("llm_request_max_inter_token_latency_seconds", 0.99).expr,
                "worst stall p99 {{model}}",
            ),
        ],
    )


def latency_fluctuation() -> PanelSpec:
    settings = _alert("InferwatchLatencyFluctuation")
    window = settings["window"]
    means = mean(ITL).expr
    return PanelSpec(
        "Inter-token latency fluctuation",
        f"Coefficient of variation (standard deviation / mean) over {window} of the mean inter-token "
        f"latency: what InferwatchLatencyFluctuation watches (with means per {settings['mean_window']}). "
        f"The same workload should stay under {settings['coefficient_of_variation_above']:.0%}.",
        "percentunit",
        above(settings["coefficient_of_variation_above"]),
        [
            Query(
                f"stddev_over_time(({means})[{window}:{RATE}]) / avg_over_time(({means})[{window}:{RATE}])",
                "{{model}}",
            )
        ],
    )


# ----------------------------------------------------------------------------------- throughput, errors


def tokens_per_second() -> PanelSpec:
    return PanelSpec(
        "Tokens per second",
        "Generated and prompt tokens per second of successful requests.",
        "suffix:tok/s",
        normal(),
        [
            Query(
                summed("rate", "llm_generation_tokens_total", SERVING, "model"),
                "generated {{model}}",
            ),
            Query(
                summed("rate", "llm_prompt_tokens_total", SERVING, "model"),
                "prompt {{model}}",
            ),
        ],
    )


def requests_by_status() -> PanelSpec:
    return PanelSpec(
        "Requests by status",
        "Finished requests per second: ok, error (the model raised) and oom (out of device memory).",
        "reqps",
        normal(),
        [
            Query(
                summed("rate", "llm_requests_total", SERVING, "model, status"),
                "{{status}} {{model}}",
            )
        ],
    )


def failed_requests() -> PanelSpec:
    limit = _alert("InferwatchRequestErrors")["error_ratio_above"]
    total = summed("rate", "llm_requests_total", SERVING, "model")
    ok = summed("rate", "llm_requests_total", f'{SERVING}, status="ok"', "model")
    return PanelSpec(
        "Failed requests",
        f"Share of requests that ended in an error or out-of-memory; InferwatchRequestErrors fires above "
        f"{limit:.0%}.",
        "percentunit",
        above(limit),
        [Query(f"1 - {ok} / {total}", "{{model}}")],
    )


def requests_running() -> PanelSpec:
    return PanelSpec(
        "Requests running",
        "Requests inside generate (or a tracked request) now.",
        "short",
        normal(),
        [Query(f"sum by (model) ({_sel('llm_requests_running', SERVING)})", "{{model}}")],
    )


def batch_size() -> PanelSpec:
    return PanelSpec(
        "Batch size",
        "Mean number of sequences per forward pass. Latency that grows linearly with it points at "
        "memory bandwidth (the bottleneck matrix of the reference notes).",
        "short",
        normal(),
        [mean("llm_batch_size")],
    )


# --------------------------------------------------------------------------------------- prefill/decode


def prefill_vs_decode() -> PanelSpec:
    return PanelSpec(
        "Prefill and decode time per request",
        "Mean prefill time (prompt to first token) and decode time (first to last token) per request, "
        "stacked: decode usually dominates, and it is what KV caching, batching and speculative decoding "
        "shorten.",
        "s",
        normal(),
        [
            Query(mean("llm_request_prefill_seconds").expr, "prefill {{model}}"),
            Query(mean("llm_request_decode_seconds").expr, "decode {{model}}"),
        ],
    )


def decode_share() -> PanelSpec:
    prefill = summed("rate", "llm_request_prefill_seconds_sum", SERVING, "model")
    decode = summed("rate", "llm_request_decode_seconds_sum", SERVING, "model")
    return PanelSpec(
        "Decode share of request time",
        "Decode time over prefill + decode time, over the selected range's rate window.",
        "percentunit",
        normal(),
        [Query(f"{decode} / ({prefill} + {decode})", "{{model}}")],
    )


def forward_time_by_phase() -> PanelSpec:
    return PanelSpec(
        "Forward time by phase",
        "Mean device time of one forward pass, prefill and decode (CUDA events; host clock on CPU).",
        "s",
        normal(),
        [mean("llm_forward_seconds", by="model, phase")],
    )


# ------------------------------------------------------------------------------------- memory and KV


def kv_cache_bytes() -> PanelSpec:
    return PanelSpec(
        "KV cache",
        "Device bytes held by the KV caches of running requests.",
        "bytes",
        normal(),
        [Query(f"sum by (model) ({_sel('llm_kv_cache_bytes', SERVING)})", "{{model}}")],
    )


def kv_cache_headroom() -> PanelSpec:
    limit = _alert("InferwatchKvCacheHeadroomLow")["headroom_tokens_below"]
    return PanelSpec(
        "KV-cache headroom",
        f"How many more KV-cache tokens fit in free device memory; InferwatchKvCacheHeadroomLow fires "
        f"below {limit}.",
        "short",
        below(limit),
        [Query(f"min by (model) ({_sel('llm_kv_cache_headroom_tokens', SERVING)})", "{{model}}")],
    )


def allocator_memory() -> PanelSpec:
    return PanelSpec(
        "Allocator memory",
        "torch's CUDA caching allocator by kind: allocated (tensors), reserved (held from the driver), "
        "max_allocated (peak). A rising allocated floor at steady load is a leak.",
        "bytes",
        normal(),
        [
            Query(
                f"sum by (instance, device, kind) ({_sel('llm_torch_memory_bytes', INSTANCE)})",
                "{{kind}} {{device}}",
            )
        ],
    )


def allocator_retries_and_ooms() -> PanelSpec:
    retries = _alert("InferwatchAllocatorRetries")
    return PanelSpec(
        "Allocator retries and OOMs",
        f"Allocations the CUDA allocator retried after freeing its cache (the early OOM signal; the alert "
        f"fires above {retries['retries_above']} per {retries['window']}) and out-of-memory errors.",
        "short",
        above(1),
        [
            Query(
                summed("increase", "llm_torch_alloc_retries_total", INSTANCE, "instance, device"),
                "retries {{device}}",
            ),
            Query(
                summed("increase", "llm_oom_events_total", SERVING, "model"),
                "OOMs {{model}}",
            ),
        ],
    )


# ------------------------------------------------------------------------------------ device efficiency


def busy_ratio() -> PanelSpec:
    limit = _alert("InferwatchHostBound")["busy_ratio_below"]
    return PanelSpec(
        "Device busy ratio",
        f"Fraction of wall time the model's forward passes occupied its device. Below {limit:.0%} while "
        "requests are in flight (InferwatchHostBound) the device waits for the host.",
        "percentunit",
        below(limit),
        [Query(f"avg by (model, device) ({_sel('llm_gpu_busy_ratio', SERVING)})", "{{model}} {{device}}")],
    )


def busy_ratio_vs_nvml() -> PanelSpec:
    spec = busy_ratio()
    nvml = Query(
        f"avg by (instance, gpu) ({_sel('gpu_utilization_ratio', GPU)})", "NVML utilization GPU {{gpu}}"
    )
    return PanelSpec(
        "Device busy ratio and NVML utilization",
        "The model's own kernels (busy ratio) next to NVML's view of the GPU: both low while requests "
        "run means the host is the bottleneck; NVML high but busy ratio low means another process uses "
        "the GPU.",
        spec.unit,
        spec.thresholds,
        [*spec.queries, nvml],
    )


def _utilization(metric: str, title: str, description: str) -> PanelSpec:
    return PanelSpec(
        title,
        description,
        "percentunit",
        steps((None, GREEN), (0.8, YELLOW)),
        [Query(f"avg by (model, device) ({_sel(metric, SERVING)})", "{{model}} {{device}}")],
    )


def decode_bandwidth() -> PanelSpec:
    return _utilization(
        "llm_decode_bandwidth_utilization_ratio",
        "Decode bandwidth utilization",
        "Bytes a decode step must read over its time, as a fraction of peak memory bandwidth. Near the "
        "peak, decode is bandwidth-bound: quantization or batching are the levers.",
    )


def prefill_flops() -> PanelSpec:
    return _utilization(
        "llm_prefill_flops_utilization_ratio",
        "Prefill FLOPs utilization",
        "2 x parameters x prompt tokens over prefill time, as a fraction of peak FLOP/s.",
    )


# -------------------------------------------------------------------------------------------- GPU (NVML)


def gpu_utilization() -> PanelSpec:
    return PanelSpec(
        "GPU utilization",
        "Fraction of time a kernel was running (NVML, mean of its samples since the last poll).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [Query(_sel("gpu_utilization_ratio", GPU), "GPU {{gpu}} {{instance}}")],
    )


def memory_bandwidth_utilization() -> PanelSpec:
    return PanelSpec(
        "Memory bandwidth utilization",
        "Fraction of time device memory was read or written (NVML).",
        "percentunit",
        steps((None, GREEN), (0.9, YELLOW)),
        [Query(_sel("gpu_memory_bandwidth_utilization_ratio", GPU), "GPU {{gpu}} {{instance}}")],
    )


def device_memory() -> PanelSpec:
    used_ratio = _alert("InferwatchGpuMemoryFillingUp")["used_ratio_above"]
    return PanelSpec(
        "Device memory",
        f"Used and total device memory. InferwatchGpuMemoryFillingUp fires when more than {used_ratio:.0%} "
        "is used and the trend crosses the total within the hour.",
        "bytes",
        normal(),
        [
            Query(_sel("gpu_memory_used_bytes", GPU), "used GPU {{gpu}} {{instance}}"),
            Query(_sel("gpu_memory_total_bytes", GPU), "total GPU {{gpu}} {{instance}}"),
        ],
    )


def power() -> PanelSpec:
    return PanelSpec(
        "Power",
        "Board power draw and the limit the driver enforces; a draw pinned at the limit with clocks below "
        "max is the SW power cap at work.",
        "watt",
        normal(),
        [
            Query(_sel("gpu_power_watts", GPU), "draw GPU {{gpu}} {{instance}}"),
            Query(_sel("gpu_power_limit_watts", GPU), "limit GPU {{gpu}} {{instance}}"),
        ],
    )


def temperature() -> PanelSpec:
    return PanelSpec(
        "Temperature",
        "Die and memory temperatures next to the GPU's own slowdown and shutdown thresholds.",
        "celsius",
        steps((None, GREEN), (80, YELLOW), (90, RED)),
        [
            Query(_sel("gpu_temperature_celsius", GPU), "{{sensor}} GPU {{gpu}} {{instance}}"),
            Query(
                _sel("gpu_temperature_threshold_celsius", GPU, 'kind=~"slowdown|shutdown"'),
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
            Query(_sel("gpu_clock_hz", GPU, 'clock=~"sm|memory"'), "{{clock}} GPU {{gpu}} {{instance}}"),
            Query(
                _sel("gpu_clock_max_hz", GPU, 'clock=~"sm|memory"'), "{{clock}} max GPU {{gpu}} {{instance}}"
            ),
        ],
    )


def sm_clock_ratio() -> PanelSpec:
    limit = _alert("InferwatchGpuClocksThrottled")["clock_ratio_below"]
    sm = _sel("gpu_clock_hz", GPU, 'clock="sm"')
    sm_max = _sel("gpu_clock_max_hz", GPU, 'clock="sm"')
    return PanelSpec(
        "SM clock / maximum",
        f"The SM clock as a fraction of its maximum; below {limit:.0%} while busy and with a SW power or "
        "thermal reason active, InferwatchGpuClocksThrottled fires.",
        "percentunit",
        below(limit),
        [Query(f"{sm} / {sm_max}", "GPU {{gpu}} {{instance}}")],
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
                f"max by (instance, gpu, reason) ({_sel('gpu_clocks_event_active', GPU)})",
                "GPU {{gpu}} {{reason}}",
            )
        ],
    )


CLOCKS_EVENT_STATES = {"0": ("-", "transparent"), "1": ("active", RED)}


def throttle_duty_cycle() -> PanelSpec:
    limit = _alert("InferwatchGpuThrottleDutyCycleHigh")["duty_cycle_ratio_above"]
    return PanelSpec(
        "Throttle time by reason",
        f"Fraction of time clocks were held back, per reason (NVML violation counters, which also catch "
        f"episodes between polls). InferwatchGpuThrottleDutyCycleHigh fires above {limit:.0%}.",
        "percentunit",
        above(limit),
        [
            Query(
                f"rate({_sel('gpu_clocks_event_seconds_total', GPU)}[{RATE}])",
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
        [Query(_sel("gpu_pstate", GPU), "GPU {{gpu}} {{instance}}")],
    )


def xid_errors() -> PanelSpec:
    return PanelSpec(
        "XID errors",
        "XID errors reported by the driver, by code; InferwatchGpuXidError pages on the hardware and "
        "driver ones.",
        "short",
        above(1),
        [Query(f"increase({_sel('gpu_xid_errors_total', GPU)}[{RATE}])", "GPU {{gpu}} XID {{xid}}")],
    )


def ecc_errors() -> PanelSpec:
    return PanelSpec(
        "ECC errors",
        "Corrected and uncorrected ECC errors, volatile (since driver load) and aggregate.",
        "short",
        above(1),
        [Query(f"increase({_sel('gpu_ecc_errors_total', GPU)}[{RATE}])", "GPU {{gpu}} {{type}} {{scope}}")],
    )


def remapped_rows() -> PanelSpec:
    return PanelSpec(
        "Remapped rows",
        "Memory rows replaced by spares, by cause; pending (needs a GPU reset) and failed (no spare left).",
        "short",
        above(1),
        [
            Query(_sel("gpu_remapped_rows", GPU), "GPU {{gpu}} {{cause}}"),
            Query(_sel("gpu_remapped_rows_pending", GPU), "GPU {{gpu}} pending"),
            Query(_sel("gpu_remapped_rows_failed", GPU), "GPU {{gpu}} failed"),
        ],
    )


def gpu_up() -> PanelSpec:
    return PanelSpec(
        "GPU answers",
        "1 while the exporter reads the GPU; 0 when it is lost (fell off the bus), hung, or NVML fails.",
        "none",
        below(1),
        [Query(_sel("gpu_up", GPU), "GPU {{gpu}} {{instance}}")],
    )


def pcie_link() -> PanelSpec:
    return PanelSpec(
        "PCIe link",
        "Current PCIe generation and width next to the maximum: a link trained below its maximum slows "
        "every host-device copy.",
        "none",
        normal(),
        [
            Query(_sel("gpu_pcie_link_gen", GPU), "gen GPU {{gpu}}"),
            Query(_sel("gpu_pcie_link_max_gen", GPU), "max gen GPU {{gpu}}"),
            Query(_sel("gpu_pcie_link_width", GPU), "width GPU {{gpu}}"),
            Query(_sel("gpu_pcie_link_max_width", GPU), "max width GPU {{gpu}}"),
        ],
    )


def pcie_traffic() -> PanelSpec:
    return PanelSpec(
        "PCIe throughput and replays",
        "Transmit and receive throughput (only with --collector.pcie-throughput) and link-level replays "
        "per second (a rising rate means a bad link or riser).",
        "Bps",
        normal(),
        [
            Query(_sel("gpu_pcie_tx_bytes_per_second", GPU), "tx GPU {{gpu}}"),
            Query(_sel("gpu_pcie_rx_bytes_per_second", GPU), "rx GPU {{gpu}}"),
            Query(f"rate({_sel('gpu_pcie_replays_total', GPU)}[{RATE}])", "replays/s GPU {{gpu}}"),
        ],
    )


def process_gpu_memory() -> PanelSpec:
    return PanelSpec(
        "GPU memory by process",
        "Device memory per compute process (the largest ones), as the driver sees it.",
        "bytes",
        normal(),
        [Query(_sel("gpu_process_memory_bytes", GPU), "GPU {{gpu}} {{comm}} ({{pid}})")],
    )


# ------------------------------------------------------------------------------------ host and monitor


def serving_process_cpu() -> PanelSpec:
    limit = _alert("InferwatchServingProcessCpuSaturated")["cpu_cores_above"]
    return PanelSpec(
        "Serving process CPU",
        f"CPU seconds per second of each serving process (user + system). A Python serving loop is bound "
        f"to one core; InferwatchServingProcessCpuSaturated fires above {limit}.",
        "short",
        above(limit),
        [
            Query(
                summed("rate", "inferwatch_process_cpu_seconds_total", INSTANCE, "instance, pid, comm"),
                "{{comm}} ({{pid}}) {{instance}}",
            )
        ],
    )


def targets_up() -> PanelSpec:
    return PanelSpec(
        "Scrape targets up",
        "1 while Prometheus scrapes the target; InferwatchTargetDown fires after a sustained 0.",
        "none",
        below(1),
        [Query(_sel("up", INSTANCE), "{{job}} {{instance}}")],
    )


def collection_age() -> PanelSpec:
    limit = _alert("InferwatchExporterCollectionStale")["age_seconds_above"]
    return PanelSpec(
        "Exporter collection age and duration",
        f"Seconds since the exporter's last complete collection (InferwatchExporterCollectionStale fires "
        f"above {limit} s) and how long the last one took.",
        "s",
        above(limit),
        [
            Query(
                f"time() - {_sel('inferwatch_exporter_last_collect_timestamp_seconds', INSTANCE)}",
                "age {{instance}}",
            ),
            Query(_sel("inferwatch_exporter_collect_duration_seconds", INSTANCE), "duration {{instance}}"),
        ],
    )


def monitor_errors() -> PanelSpec:
    return PanelSpec(
        "NVML and instrumentation errors",
        "Failed NVML calls in the exporter (not_supported is counted once per GPU) and errors the "
        "instrumentation caught in the serving process, per second.",
        "cps",
        above(0.01),
        [
            Query(
                summed("rate", "inferwatch_exporter_nvml_errors_total", INSTANCE, "instance, call, error"),
                "NVML {{call}} {{error}}",
            ),
            Query(
                summed("rate", "llm_instrumentation_errors_total", INSTANCE, "instance, stage"),
                "instrumentation {{stage}} {{instance}}",
            ),
        ],
    )
