"""The expressions ``inferwatch top`` shows and ``inferwatch diagnose`` judges, over the metric names of
docs/metrics.md: ``llm_*`` from instrumented serving processes, ``gpu_*``, ``host_*`` and
``inferwatch_process_*`` from ``inferwatch-exporter``, and ``process_*`` from prometheus_client's own
process collector in the serving process.

Model series are grouped per serving process (``instance``, ``model``): one replica can be host-bound
while the others are not. GPU series are grouped by exporter and GPU index (``instance``, ``gpu``).
"""

from __future__ import annotations

from inferwatch.monitor.expr import Gauge, Quantile, Rate, Ratio, Selector, histogram_mean

MODEL = ("instance", "model")
GPU = ("instance", "gpu")
PROCESS = ("instance", "pid", "comm")
HOST = ("instance",)

# --- instrumented serving processes -------------------------------------------------------------------
TTFT = Selector("llm_time_to_first_token_seconds")
ITL = Selector("llm_inter_token_latency_seconds")
TTFT_P50 = Quantile(0.5, TTFT, MODEL)
TTFT_P99 = Quantile(0.99, TTFT, MODEL)
ITL_P50 = Quantile(0.5, ITL, MODEL)
ITL_P99 = Quantile(0.99, ITL, MODEL)
TTFT_MEAN = histogram_mean(TTFT, MODEL)
ITL_MEAN = histogram_mean(ITL, MODEL)
TPOT_MEAN = histogram_mean(Selector("llm_request_time_per_output_token_seconds"), MODEL)
PREFILL_MEAN = histogram_mean(Selector("llm_request_prefill_seconds"), MODEL)
PROMPT_TOKENS_MEAN = histogram_mean(Selector("llm_request_prompt_tokens"), MODEL)
GENERATION_TOKENS_MEAN = histogram_mean(Selector("llm_request_generation_tokens"), MODEL)
BATCH_MEAN = histogram_mean(Selector("llm_batch_size"), MODEL)
DECODE_FORWARD_MEAN = histogram_mean(Selector("llm_forward_seconds", (("phase", "decode"),)), MODEL)
TOKENS_RATE = Rate(Selector("llm_generation_tokens_total"), MODEL)
TOTAL_TOKENS_RATE = Rate(Selector("llm_generation_tokens_total"), ())
RUNNING = Gauge(Selector("llm_requests_running"), MODEL)
BUSY = Gauge(Selector("llm_gpu_busy_ratio"), MODEL, "avg")
KV_BYTES = Gauge(Selector("llm_kv_cache_bytes"), MODEL)
KV_HEADROOM = Gauge(Selector("llm_kv_cache_headroom_tokens"), MODEL, "min")
OOM_RATE = Rate(Selector("llm_oom_events_total"), MODEL)
ALLOC_RETRY_RATE = Rate(Selector("llm_torch_alloc_retries_total"), ("instance", "device"))
BANDWIDTH_UTIL = Gauge(Selector("llm_decode_bandwidth_utilization_ratio"), MODEL, "max")
FLOPS_UTIL = Gauge(Selector("llm_prefill_flops_utilization_ratio"), MODEL, "max")
TORCH_ALLOCATED = Gauge(Selector("llm_torch_memory_bytes", (("kind", "allocated"),)), ("instance", "device"))
MODEL_INFO = Selector("llm_model_info")
SERVING_INSTANCES = Gauge(MODEL_INFO, HOST, "max")
# prometheus_client's process collector, which every serving process using its default registry has.
SERVING_RSS = Gauge(Selector("process_resident_memory_bytes"), HOST, "max")

# --- the exporter: GPUs ---------------------------------------------------------------------------------
GPU_INFO = Selector("gpu_info")
GPU_UP = Gauge(Selector("gpu_up"), GPU, "min")
GPU_UTIL = Gauge(Selector("gpu_utilization_ratio"), GPU, "max")
GPU_MEMORY_USED = Gauge(Selector("gpu_memory_used_bytes"), GPU, "max")
GPU_MEMORY_FREE = Gauge(Selector("gpu_memory_free_bytes"), GPU, "max")
GPU_MEMORY_TOTAL = Gauge(Selector("gpu_memory_total_bytes"), GPU, "max")
MEMORY_FREE_SHARE = Ratio(GPU_MEMORY_FREE, GPU_MEMORY_TOTAL)
GPU_POWER = Gauge(Selector("gpu_power_watts"), GPU, "max")
GPU_POWER_LIMIT = Gauge(Selector("gpu_power_limit_watts"), GPU, "max")
SM_CLOCK = Gauge(Selector("gpu_clock_hz", (("clock", "sm"),)), GPU, "max")
SM_CLOCK_MAX = Gauge(Selector("gpu_clock_max_hz", (("clock", "sm"),)), GPU, "max")
SM_CLOCK_SHARE = Ratio(SM_CLOCK, SM_CLOCK_MAX)
GPU_TEMPERATURE = Gauge(Selector("gpu_temperature_celsius", (("sensor", "gpu"),)), GPU, "max")
GPU_SLOWDOWN_TEMPERATURE = Gauge(
    Selector("gpu_temperature_threshold_celsius", (("kind", "slowdown"),)), GPU, "max"
)
CLOCK_EVENT_ACTIVE = Gauge(Selector("gpu_clocks_event_active"), (*GPU, "reason"), "max")
CLOCK_EVENT_DUTY = Rate(Selector("gpu_clocks_event_seconds_total"), (*GPU, "reason"))
# Clocks-event reasons that are not throttling: an idle GPU, clocks set on purpose, and policy states.
BENIGN_CLOCK_REASONS = frozenset(
    {"gpu_idle", "applications_clocks_setting", "display_clock_setting", "sync_boost", "low_utilization"}
)

# --- the exporter: host and serving processes --------------------------------------------------------
HOST_CPU_RATE = Rate(Selector("host_cpu_seconds_total"), HOST)
HOST_CPU_IDLE_RATE = Rate(Selector("host_cpu_seconds_total", (("mode", "idle"),)), HOST)
HOST_CPUS = Gauge(Selector("host_cpus"), HOST, "max")
HOST_MEMORY_TOTAL = Gauge(Selector("host_memory_total_bytes"), HOST, "max")
HOST_MEMORY_AVAILABLE = Gauge(Selector("host_memory_available_bytes"), HOST, "max")
PROCESS_CPU_RATE = Rate(Selector("inferwatch_process_cpu_seconds_total"), PROCESS)
PROCESS_RSS = Gauge(Selector("inferwatch_process_resident_memory_bytes"), PROCESS, "max")
