"""The expressions ``inferwatch top`` shows and ``inferwatch diagnose`` judges, over the metric names of
docs/metrics.md: ``llm_*`` from instrumented serving processes, ``gpu_*``, ``host_*`` and
``inferwatch_process_*`` from ``inferwatch-exporter``, and ``process_*`` from prometheus_client's own
process collector in the serving process.

Model series are grouped per scrape target and model (``job``, ``instance``, ``model``: the one
grouping of :data:`inferwatch.common.promql.PER_MODEL`, which the recording rules, alerts and
dashboards use too): one replica can be host-bound while the others are not. GPU series are grouped
by exporter, GPU index and UUID (``instance``, ``gpu``, ``uuid``). A model is tied to its GPU by
``uuid`` alone, the label both sides carry as NVML spells it: its ``device`` (``cuda:0``) is numbered
by its own process and container, and its ``instance`` is the serving endpoint's address, not the
exporter's.
"""

from __future__ import annotations

from inferwatch.common import names
from inferwatch.common.promql import PER_MODEL, Selector, eq
from inferwatch.monitor.expr import Gauge, Quantile, Rate, Ratio, histogram_mean

MODEL = PER_MODEL
GPU = ("instance", "gpu", "uuid")
PROCESS = ("instance", "pid", "comm")
HOST = ("instance",)

# --- instrumented serving processes -------------------------------------------------------------------
TTFT = Selector(names.LLM_TIME_TO_FIRST_TOKEN_SECONDS)
ITL = Selector(names.LLM_INTER_TOKEN_LATENCY_SECONDS)
QUEUE = Selector(names.LLM_REQUEST_QUEUE_SECONDS)
TTFT_P50 = Quantile(0.5, TTFT, MODEL)
TTFT_P99 = Quantile(0.99, TTFT, MODEL)
QUEUE_P99 = Quantile(0.99, QUEUE, MODEL)
ITL_P50 = Quantile(0.5, ITL, MODEL)
ITL_P99 = Quantile(0.99, ITL, MODEL)
TTFT_MEAN = histogram_mean(TTFT, MODEL)
ITL_MEAN = histogram_mean(ITL, MODEL)
QUEUE_MEAN = histogram_mean(QUEUE, MODEL)
TPOT_MEAN = histogram_mean(Selector(names.LLM_REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS), MODEL)
PREFILL_MEAN = histogram_mean(Selector(names.LLM_REQUEST_PREFILL_SECONDS), MODEL)
PROMPT_TOKENS_MEAN = histogram_mean(Selector(names.LLM_REQUEST_PROMPT_TOKENS), MODEL)
GENERATION_TOKENS_MEAN = histogram_mean(Selector(names.LLM_REQUEST_GENERATION_TOKENS), MODEL)
BATCH_MEAN = histogram_mean(Selector(names.LLM_BATCH_SIZE), MODEL)
DECODE_FORWARD_MEAN = histogram_mean(Selector(names.LLM_FORWARD_SECONDS, (eq("phase", "decode"),)), MODEL)
TOKENS_RATE = Rate(Selector(names.LLM_GENERATION_TOKENS_TOTAL), MODEL)
TOTAL_TOKENS_RATE = Rate(Selector(names.LLM_GENERATION_TOKENS_TOTAL), ())
# Speculative decoding in generate (assistant_model=, prompt lookup): draft tokens proposed per second, and
# the share of them the model accepted. Only models that speculate have the series.
SPEC_DRAFT_RATE = Rate(Selector(names.LLM_SPEC_DECODE_DRAFT_TOKENS_TOTAL), MODEL)
SPEC_ACCEPTANCE = Ratio(Rate(Selector(names.LLM_SPEC_DECODE_ACCEPTED_TOKENS_TOTAL), MODEL), SPEC_DRAFT_RATE)
# Why the requests a model ran finished: each reason's share of them (finish_reason, as the OpenAI API's).
FINISHED_RATE = Rate(Selector(names.LLM_REQUESTS_FINISHED_TOTAL), MODEL)


def _finished_share(reason: str) -> Ratio:
    return Ratio(
        Rate(Selector(names.LLM_REQUESTS_FINISHED_TOTAL, (eq("finish_reason", reason),)), MODEL),
        FINISHED_RATE,
    )


FINISHED_STOP = _finished_share("stop")
FINISHED_LENGTH = _finished_share("length")
FINISHED_CANCELLED = _finished_share("cancelled")
FINISHED_ERROR = _finished_share("error")
FINISHED_OOM = _finished_share("oom")
# At the HTTP edge (the ASGI/WSGI middleware): arrival to the first body chunk with content, the requests
# whose clients went away, and the tokens generated for them after they left.
FIRST_CONTENT = Selector(names.LLM_RESPONSE_TIME_TO_FIRST_CONTENT_SECONDS)
FIRST_CONTENT_P50 = Quantile(0.5, FIRST_CONTENT, MODEL)
FIRST_CONTENT_P99 = Quantile(0.99, FIRST_CONTENT, MODEL)
CANCELLED_RATE = Rate(Selector(names.LLM_REQUESTS_TOTAL, (eq("status", "cancelled"),)), MODEL)
WASTED_TOKENS_RATE = Rate(Selector(names.LLM_WASTED_TOKENS_TOTAL), MODEL)
RUNNING = Gauge(Selector(names.LLM_REQUESTS_RUNNING), MODEL)
WAITING = Gauge(Selector(names.LLM_REQUESTS_WAITING), MODEL)
# How long ago the oldest running request arrived (0 while none runs): one request that does not end.
OLDEST_RUNNING_AGE = Gauge(Selector(names.LLM_REQUEST_OLDEST_RUNNING_AGE_SECONDS), MODEL, "max")
# The share of wall time the GPU ran the serving process's kernels (NVML); GPU models only.
BUSY = Gauge(Selector(names.LLM_GPU_BUSY_RATIO), MODEL, "avg")
# Per serving process and GPU: every model of a process shows the process's share of its GPU.
BUSY_BY_GPU = Gauge(Selector(names.LLM_GPU_BUSY_RATIO), ("instance", "uuid"), "max")
# Why a GPU has no busy ratio, by reason (all of them are 1).
BUSY_UNAVAILABLE = Gauge(Selector(names.LLM_GPU_BUSY_UNAVAILABLE), ("instance", "device", "reason"), "max")
# The share of wall time inside the model's forward passes (spans, not kernel time); every device.
FORWARD_TIME = Gauge(Selector(names.LLM_FORWARD_TIME_RATIO), MODEL, "avg")
KV_BYTES = Gauge(Selector(names.LLM_KV_CACHE_BYTES), MODEL)
KV_HEADROOM = Gauge(Selector(names.LLM_KV_CACHE_HEADROOM_TOKENS), MODEL, "min")
# A paged KV cache (continuous batching) only: its blocks by state, and the scheduler's preemptions.
KV_BLOCKS_USED = Gauge(Selector(names.LLM_KV_CACHE_BLOCKS, (eq("state", "used"),)), MODEL)
KV_BLOCKS_TOTAL = Gauge(Selector(names.LLM_KV_CACHE_BLOCKS, (eq("state", "total"),)), MODEL)
KV_BLOCKS_USED_SHARE = Ratio(KV_BLOCKS_USED, KV_BLOCKS_TOTAL)
KV_PREEMPTION_RATE = Rate(Selector(names.LLM_KV_CACHE_PREEMPTIONS_TOTAL), MODEL)
OOM_RATE = Rate(Selector(names.LLM_OOM_EVENTS_TOTAL), MODEL)
ALLOC_RETRY_RATE = Rate(Selector(names.LLM_TORCH_ALLOC_RETRIES_TOTAL), ("instance", "device"))
BANDWIDTH_UTIL = Gauge(Selector(names.LLM_DECODE_BANDWIDTH_UTILIZATION_RATIO), MODEL, "max")
FLOPS_UTIL = Gauge(Selector(names.LLM_PREFILL_FLOPS_UTILIZATION_RATIO), MODEL, "max")
TORCH_ALLOCATED = Gauge(
    Selector(names.LLM_TORCH_MEMORY_BYTES, (eq("kind", "allocated"),)), ("instance", "device")
)
MODEL_INFO = Selector(names.LLM_MODEL_INFO)
SERVING_INSTANCES = Gauge(MODEL_INFO, HOST, "max")
# Which GPU each model runs on (uuid; mig_uuid on a MIG instance).
MODEL_GPUS = Gauge(MODEL_INFO, (*MODEL, "uuid", "mig_uuid"), "max")
# prometheus_client's process collector, which every serving process using its default registry has.
SERVING_RSS = Gauge(Selector(names.PROCESS_RESIDENT_MEMORY_BYTES), HOST, "max")

# --- the exporter: GPUs ---------------------------------------------------------------------------------
GPU_INFO = Selector(names.GPU_INFO)
GPU_UP = Gauge(Selector(names.GPU_UP), GPU, "min")
GPU_UTIL = Gauge(Selector(names.GPU_UTILIZATION_RATIO), GPU, "max")
# NVML GPM, of the whole GPU (gpu_instance="": not of one MIG instance).
WHOLE_GPU = (eq("gpu_instance", ""),)
SM_ACTIVE = Gauge(Selector(names.GPU_SM_ACTIVE_RATIO, WHOLE_GPU), GPU, "max")
GRAPHICS_ACTIVE = Gauge(Selector(names.GPU_GRAPHICS_ACTIVE_RATIO, WHOLE_GPU), GPU, "max")
TENSOR_ACTIVE = Gauge(Selector(names.GPU_TENSOR_ACTIVE_RATIO, WHOLE_GPU), GPU, "max")
FP32_ACTIVE = Gauge(Selector(names.GPU_FP32_ACTIVE_RATIO, WHOLE_GPU), GPU, "max")
GPU_MEMORY_USED = Gauge(Selector(names.GPU_MEMORY_USED_BYTES), GPU, "max")
GPU_MEMORY_FREE = Gauge(Selector(names.GPU_MEMORY_FREE_BYTES), GPU, "max")
GPU_MEMORY_TOTAL = Gauge(Selector(names.GPU_MEMORY_TOTAL_BYTES), GPU, "max")
MEMORY_FREE_SHARE = Ratio(GPU_MEMORY_FREE, GPU_MEMORY_TOTAL)
GPU_POWER = Gauge(Selector(names.GPU_POWER_WATTS), GPU, "max")
GPU_POWER_LIMIT = Gauge(Selector(names.GPU_POWER_LIMIT_WATTS), GPU, "max")
SM_CLOCK = Gauge(Selector(names.GPU_CLOCK_HZ, (eq("clock", "sm"),)), GPU, "max")
SM_CLOCK_MAX = Gauge(Selector(names.GPU_CLOCK_MAX_HZ, (eq("clock", "sm"),)), GPU, "max")
SM_CLOCK_SHARE = Ratio(SM_CLOCK, SM_CLOCK_MAX)
GPU_TEMPERATURE = Gauge(Selector(names.GPU_TEMPERATURE_CELSIUS, (eq("sensor", "gpu"),)), GPU, "max")
GPU_SLOWDOWN_TEMPERATURE = Gauge(
    Selector(names.GPU_TEMPERATURE_THRESHOLD_CELSIUS, (eq("kind", "slowdown"),)), GPU, "max"
)
CLOCK_EVENT_ACTIVE = Gauge(Selector(names.GPU_CLOCKS_EVENT_ACTIVE), (*GPU, "reason"), "max")
CLOCK_EVENT_DUTY = Rate(Selector(names.GPU_CLOCKS_EVENT_SECONDS_TOTAL), (*GPU, "reason"))
# The processes on each GPU (their memory), and the Kubernetes pods that hold it (PodResources).
GPU_PROCESS_MEMORY = Gauge(Selector(names.GPU_PROCESS_MEMORY_BYTES), ("instance", "uuid", "pid"), "max")
GPU_PODS = Gauge(Selector(names.GPU_KUBERNETES_POD_INFO), ("uuid", "namespace", "pod"), "max")

# --- the exporter: host and serving processes --------------------------------------------------------
HOST_CPU_RATE = Rate(Selector(names.HOST_CPU_SECONDS_TOTAL), HOST)
HOST_CPU_IDLE_RATE = Rate(Selector(names.HOST_CPU_SECONDS_TOTAL, (eq("mode", "idle"),)), HOST)
HOST_CPUS = Gauge(Selector(names.HOST_CPUS), HOST, "max")
HOST_MEMORY_TOTAL = Gauge(Selector(names.HOST_MEMORY_TOTAL_BYTES), HOST, "max")
HOST_MEMORY_AVAILABLE = Gauge(Selector(names.HOST_MEMORY_AVAILABLE_BYTES), HOST, "max")
PROCESS_CPU_RATE = Rate(Selector(names.INFERWATCH_PROCESS_CPU_SECONDS_TOTAL), PROCESS)
PROCESS_RSS = Gauge(Selector(names.INFERWATCH_PROCESS_RESIDENT_MEMORY_BYTES), PROCESS, "max")
