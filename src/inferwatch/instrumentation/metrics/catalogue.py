"""The one source of truth for every ``llm_*`` metric the instrumentation exposes.

Each :class:`MetricSpec` names a family, its type, help text, unit, labels, histogram buckets (a field of
:class:`~inferwatch.instrumentation.config.InstrumentConfig`) and, for gauges, how prometheus_client's
multiprocess mode merges the values of several worker processes. :class:`Metrics` turns the catalogue
into collectors on one registry; docs/metrics.md documents the same list (a test keeps them in step).

Label values are bounded: ``model`` is the name given to ``instrument()`` (one per instrumented model),
``device`` is a torch device string (``cuda:0``) with its GPU's ``uuid`` and ``mig_uuid`` (one of each per
device), the rest are fixed enumerations.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.metrics.collector import CatalogueCollector
from inferwatch.instrumentation.metrics.containment import ErrorReporter

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family. ``name`` is what a user queries: counters carry their ``_total`` suffix."""

    name: str
    type: MetricType
    unit: str
    labels: tuple[str, ...]
    help: str
    #: Histograms: the InstrumentConfig field holding the bucket bounds.
    buckets: str | None = None
    #: Gauges: prometheus_client's multiprocess_mode (how values of several processes combine).
    multiprocess_mode: str | None = None


def _histogram(name: str, unit: str, labels: tuple[str, ...], buckets: str, help_: str) -> MetricSpec:
    return MetricSpec(name, "histogram", unit, labels, help_, buckets=buckets)


def _counter(name: str, unit: str, labels: tuple[str, ...], help_: str) -> MetricSpec:
    return MetricSpec(name, "counter", unit, labels, help_)


def _gauge(name: str, unit: str, labels: tuple[str, ...], mode: str, help_: str) -> MetricSpec:
    return MetricSpec(name, "gauge", unit, labels, help_, multiprocess_mode=mode)


M = ("model",)
#: The labels of a per-device series (hardware.DeviceIdentity): torch's device name in this process, and
#: the GPU's UUID (and MIG device's) as NVML spells them, which join with the exporter's gpu_* series.
DEVICE = ("device", "uuid", "mig_uuid")

TTFT = _histogram(
    "llm_time_to_first_token_seconds", "seconds", M, "ttft_buckets",
    "Time from a request's arrival at the server (where known: inferwatch run's transformers serve hook, "
    "the ASGI/WSGI middleware, request_arrival) or else its entry into generate, until its first token "
    "reached the client: behind the HTTP edge, the first response chunk with content handed to the "
    "server; elsewhere, the first token sampled on the device.",
)  # fmt: skip
ITL = _histogram(
    "llm_inter_token_latency_seconds", "seconds", M, "itl_buckets",
    "Time between consecutive tokens of a request, one observation per token "
    "(a step that yields k tokens per sequence observes k times interval/k).",
)  # fmt: skip
TPOT = _histogram(
    "llm_request_time_per_output_token_seconds", "seconds", M, "tpot_buckets",
    "Per request: mean time per output token after the first (decode time / (tokens - 1)).",
)  # fmt: skip
MAX_ITL = _histogram(
    "llm_request_max_inter_token_latency_seconds", "seconds", M, "tpot_buckets",
    "Per request: the longest gap between two consecutive tokens (worst stall).",
)  # fmt: skip
E2E = _histogram(
    "llm_e2e_request_latency_seconds", "seconds", ("model", "outcome"), "e2e_buckets",
    "Per request that ended served (outcome=ok: to the return of generate) or cancelled (outcome="
    "cancelled: to when its client went away): host time from its arrival (where known) or entry into "
    "generate.",
)  # fmt: skip
PREFILL = _histogram(
    "llm_request_prefill_seconds", "seconds", M, "ttft_buckets",
    "Per request: from the start of its first forward on the device to its first token.",
)  # fmt: skip
DECODE = _histogram(
    "llm_request_decode_seconds", "seconds", M, "e2e_buckets",
    "Per request: from its first token to its last token.",
)  # fmt: skip
FORWARD = _histogram(
    "llm_forward_seconds", "seconds", ("model", "phase"), "forward_buckets",
    "Device time of one forward pass (CUDA events; host clock on CPU), by phase: prefill, decode, or "
    "mixed (a continuous-batching step that carries prompt tokens and decode tokens together).",
)  # fmt: skip
PROMPT_TOKENS_HIST = _histogram(
    "llm_request_prompt_tokens", "tokens", M, "token_buckets",
    "Per successful or cancelled request: prompt tokens, padding excluded, summed over the batch.",
)  # fmt: skip
GENERATION_TOKENS_HIST = _histogram(
    "llm_request_generation_tokens", "tokens", M, "token_buckets",
    "Per successful or cancelled request: generated tokens up to and including EOS, summed over the "
    "batch.",
)  # fmt: skip
BATCH_SIZE = _histogram(
    "llm_batch_size", "sequences", M, "batch_buckets",
    "Sequences in one forward pass (continuous batching: the requests scheduled in the step).",
)  # fmt: skip
STEP_TOKENS = _histogram(
    "llm_step_tokens", "tokens", ("model", "kind"), "step_token_buckets",
    "Tokens one forward pass processed, by kind: prefill (prompt tokens) or decode (one per sequence "
    "generating its next token). A continuous-batching step usually holds both.",
)  # fmt: skip

QUEUE = _histogram(
    "llm_request_queue_seconds", "seconds", M, "ttft_buckets",
    "Per request with a known arrival: from its arrival at the server until its first forward started "
    "on the device.",
)  # fmt: skip

REQUESTS = _counter(
    "llm_requests_total", "requests", ("model", "status"),
    "Finished requests by status: ok, error (the model raised), oom (out of device memory), cancelled "
    "(the client went away), rejected (a client mistake: a 4xx answer before any model ran, or zero new "
    "tokens asked for), server_error (a 5xx answer before any model ran).",
)  # fmt: skip
FINISHED = _counter(
    "llm_requests_finished_total", "requests", ("model", "finish_reason"),
    "Requests a model ran, by why they ended, as the OpenAI API's finish_reason: stop (EOS, a stop "
    "string or another stopping criterion), length (max_new_tokens reached), cancelled, error, oom.",
)  # fmt: skip
WASTED_TOKENS = _counter(
    "llm_wasted_tokens_total", "tokens", M,
    "Tokens generated for a cancelled request that never reached its client: sampled after the last chunk "
    "of its response was sent (behind the HTTP edge), else after it went away (counted in "
    "llm_generation_tokens_total too).",
)  # fmt: skip
RESPONSE_FIRST_CONTENT = _histogram(
    "llm_response_time_to_first_content_seconds", "seconds", M, "ttft_buckets",
    "What the server sent: from a request's arrival until the middleware passed the first body byte that "
    "carries generated content to the server (an event-stream's first event with content), beside "
    "llm_time_to_first_token_seconds, what the model produced.",
)  # fmt: skip
RESPONSE_LAST_BYTE = _histogram(
    "llm_response_time_to_last_byte_seconds", "seconds", M, "e2e_buckets",
    "What the server sent: from a request's arrival until the middleware passed the last body byte of a "
    "completed response to the server, beside llm_e2e_request_latency_seconds.",
)  # fmt: skip
SOCKET_WAIT = _histogram(
    "llm_request_socket_wait_seconds", "seconds", M, "socket_wait_buckets",
    "Per HTTP request whose connection said when its data came in (TCP on Linux, under uvicorn or "
    "werkzeug): from the kernel's receipt of the request until the server handed it to the middleware, "
    "included in the request's TTFT, E2E and queue time. Long when the server is kept from reading.",
)  # fmt: skip
ARRIVAL_SOURCES = _counter(
    "llm_http_arrivals_total", "requests", ("source",),
    "Model requests (a generate, batched or tracked request claimed the arrival) that came through the "
    "ASGI/WSGI middleware, counted as they are claimed, by where their arrival time came from: socket (the "
    "kernel's receipt, read from the connection) or application (the middleware's call: another server or "
    "a connection that does not say).",
)  # fmt: skip
PROMPT_TOKENS = _counter(
    "llm_prompt_tokens_total",
    "tokens",
    M,
    "Prompt tokens, padding excluded, counted once a request's prefill has run.",
)
GENERATION_TOKENS = _counter(
    "llm_generation_tokens_total", "tokens", M,
    "Tokens generated, up to and including EOS (padding after EOS excluded), counted as they are produced "
    "and made exact when the request ends.",
)  # fmt: skip
SPEC_DRAFT_TOKENS = _counter(
    "llm_spec_decode_draft_tokens_total", "tokens", M,
    "Speculative decoding in generate (assistant_model=, prompt_lookup_num_tokens=): draft tokens "
    "proposed to the model for verification, summed over rounds. Absent for a model that never "
    "speculated.",
)  # fmt: skip
SPEC_ACCEPTED_TOKENS = _counter(
    "llm_spec_decode_accepted_tokens_total", "tokens", M,
    "Speculative decoding in generate: draft tokens the model accepted (kept in its output), summed over "
    "rounds; accepted / draft is the acceptance rate.",
)  # fmt: skip
OOM_EVENTS = _counter(
    "llm_oom_events_total", "events", M,
    "Out-of-memory errors raised by the model (torch.cuda.OutOfMemoryError or an allocator message).",
)  # fmt: skip
ALLOC_RETRIES = _counter(
    "llm_torch_alloc_retries_total", "retries", DEVICE,
    "Times torch's CUDA caching allocator freed its cache and retried a failed allocation "
    "(the early OOM signal).",
)  # fmt: skip
INSTRUMENTATION_ERRORS = _counter(
    "llm_instrumentation_errors_total", "errors", ("stage",),
    "Errors inside inferwatch, contained and never raised into the model, by stage.",
)  # fmt: skip

REQUESTS_RUNNING = _gauge(
    "llm_requests_running", "requests", M, "livesum", "Requests inside generate (or a tracked request) now."
)
OLDEST_RUNNING_AGE = _gauge(
    "llm_request_oldest_running_age_seconds", "seconds", M, "livemax",
    "Age of the oldest request counted in llm_requests_running: now minus its arrival at the server "
    "(where known) or else its entry into generate, computed when scraped; 0 while none runs. In "
    "multiprocess mode: as of the worker's last update (a request starting or ending, a step, a poll).",
)  # fmt: skip
REQUESTS_WAITING = _gauge(
    "llm_requests_waiting", "requests", M, "livesum",
    "Requests that arrived at the server for this model and have not entered generate yet (queued).",
)  # fmt: skip
KV_CACHE_BYTES = _gauge(
    "llm_kv_cache_bytes", "bytes", M, "livesum",
    "Device bytes held by the KV caches of running requests (shapes only, never data).",
)  # fmt: skip
KV_CACHE_BYTES_PER_TOKEN = _gauge(
    "llm_kv_cache_bytes_per_token", "bytes", M, "livemax",
    "KV-cache bytes one token of one sequence takes (all layers, keys and values).",
)  # fmt: skip
KV_CACHE_CAPACITY_TOKENS = _gauge(
    "llm_kv_cache_capacity_tokens", "tokens", M, "livesum",
    "Tokens the preallocated (static) KV caches of running requests hold: max_cache_len x batch.",
)  # fmt: skip
KV_CACHE_CAPACITY_BYTES = _gauge(
    "llm_kv_cache_capacity_bytes", "bytes", M, "livesum",
    "Device bytes of a paged KV cache's pool (continuous batching), allocated up front: capacity tokens x "
    "bytes per token.",
)  # fmt: skip
KV_CACHE_BLOCKS = _gauge(
    "llm_kv_cache_blocks", "blocks", ("model", "state"), "livesum",
    "Blocks of a paged KV cache (continuous batching) by state: used (held by requests), prefix_cached "
    "(complete blocks no request holds, kept for prompts that start with the same tokens; given to "
    "requests that need room), or total.",
)  # fmt: skip
KV_CACHE_PREFIX_TOKENS = _counter(
    "llm_kv_cache_prefix_tokens_total", "tokens", ("model", "result"),
    "Prompt tokens of requests looked up in a paged KV cache's prefix cache (continuous batching) when "
    "first scheduled, by result: hit (their keys and values were in cached blocks, not computed) or miss.",
)  # fmt: skip
KV_CACHE_PREEMPTIONS = _counter(
    "llm_kv_cache_preemptions_total", "requests", M,
    "Requests the continuous-batching scheduler took off the device to free KV-cache blocks.",
)  # fmt: skip
KV_CACHE_HEADROOM_TOKENS = _gauge(
    "llm_kv_cache_headroom_tokens", "tokens", M, "livemin",
    "How many more KV-cache tokens fit in free device memory (free + allocator-cached) / bytes per token.",
)  # fmt: skip
TORCH_MEMORY = _gauge(
    "llm_torch_memory_bytes", "bytes", (*DEVICE, "kind"), "livesum",
    "torch CUDA allocator memory of this process by kind: allocated, reserved, active, max_allocated.",
)  # fmt: skip
GPU_BUSY = _gauge(
    "llm_gpu_busy_ratio", "ratio", ("model", *DEVICE, "source"), "livesum",
    "Fraction of wall time the GPU ran this serving process's kernels over the last poll window, from "
    "the driver: source=process (NVML's utilization of this process) or device (the GPU's own "
    "utilization: this process is its only compute process). Absent where neither can be had "
    "(llm_gpu_busy_unavailable says why).",
)  # fmt: skip
GPU_BUSY_UNAVAILABLE = _gauge(
    "llm_gpu_busy_unavailable", "1", (*DEVICE, "reason"), "livemax",
    "1 while llm_gpu_busy_ratio cannot be measured for this GPU, by reason: nvml_disabled, "
    "nvml_unavailable, not_supported, process_not_visible, process_ambiguous.",
)  # fmt: skip
FORWARD_TIME_RATIO = _gauge(
    "llm_forward_time_ratio", "ratio", ("model", *DEVICE), "livesum",
    "Fraction of wall time inside the model's forward passes (start to end mark on their stream; host "
    "time on the CPU) over the last poll window. Not kernel time: a host-bound step's span is the host "
    "launching its kernels.",
)  # fmt: skip
DECODE_BANDWIDTH = _gauge(
    "llm_decode_bandwidth_utilization_ratio", "ratio", ("model", *DEVICE), "livemax",
    "Bytes a decode step must read (weights but the input embedding table, plus the KV cache) / decode "
    "step time / peak memory bandwidth, over the last poll window with decode steps.",
)  # fmt: skip
PREFILL_FLOPS = _gauge(
    "llm_prefill_flops_utilization_ratio", "ratio", ("model", *DEVICE), "livemax",
    "2 x matmul parameters (all but the embedding and output tables) x prompt tokens / prefill forward "
    "time / peak FLOP/s, over the last poll window with prefill steps.",
)  # fmt: skip
NVML_GPU_UTILIZATION = _gauge(
    "llm_nvml_gpu_utilization_ratio", "ratio", DEVICE, "livemostrecent",
    "NVML GPU utilization of the model's device, read in the serving process.",
)  # fmt: skip
NVML_MEMORY_USED = _gauge(
    "llm_nvml_gpu_memory_used_bytes", "bytes", DEVICE, "livemostrecent",
    "NVML used memory of the model's device (all processes).",
)  # fmt: skip
NVML_MEMORY_TOTAL = _gauge(
    "llm_nvml_gpu_memory_total_bytes", "bytes", DEVICE, "livemostrecent",
    "NVML total memory of the model's device.",
)  # fmt: skip
NVML_PROCESS_MEMORY = _gauge(
    "llm_nvml_process_gpu_memory_bytes", "bytes", DEVICE, "livesum",
    "NVML device memory used by this serving process (driver view, includes the CUDA context).",
)  # fmt: skip
MODEL_INFO = _gauge(
    "llm_model_info", "info", ("model", "model_type", "dtype", *DEVICE, "params"), "livemax",
    "1 while the model is instrumented: its identity (type, parameter count, dtype, device). "
    "Removed with the instrumentation (set to 0 in multiprocess mode).",
)  # fmt: skip
LAST_STEP = _gauge(
    "llm_last_step_timestamp_seconds", "seconds", M, "livemax",
    "Unix time of the model's last forward pass or tracked token, to 0.1 s (hung-engine heartbeat).",
)  # fmt: skip

CATALOGUE: tuple[MetricSpec, ...] = (
    TTFT, ITL, TPOT, MAX_ITL, E2E, PREFILL, DECODE, QUEUE, FORWARD, PROMPT_TOKENS_HIST,
    GENERATION_TOKENS_HIST, BATCH_SIZE, STEP_TOKENS, REQUESTS, FINISHED, PROMPT_TOKENS, GENERATION_TOKENS,
    WASTED_TOKENS, RESPONSE_FIRST_CONTENT, RESPONSE_LAST_BYTE, SOCKET_WAIT, ARRIVAL_SOURCES,
    OOM_EVENTS, ALLOC_RETRIES, INSTRUMENTATION_ERRORS, REQUESTS_RUNNING, OLDEST_RUNNING_AGE, REQUESTS_WAITING,
    KV_CACHE_BYTES, KV_CACHE_BYTES_PER_TOKEN, KV_CACHE_CAPACITY_TOKENS, KV_CACHE_BLOCKS,
    KV_CACHE_CAPACITY_BYTES, KV_CACHE_PREFIX_TOKENS, KV_CACHE_PREEMPTIONS, KV_CACHE_HEADROOM_TOKENS,
    TORCH_MEMORY, GPU_BUSY, GPU_BUSY_UNAVAILABLE, FORWARD_TIME_RATIO, DECODE_BANDWIDTH,
    PREFILL_FLOPS, NVML_GPU_UTILIZATION, NVML_MEMORY_USED, NVML_MEMORY_TOTAL, NVML_PROCESS_MEMORY,
    MODEL_INFO, LAST_STEP,
    SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS,
)  # fmt: skip


def _bucket_config(config: InstrumentConfig) -> dict[str, tuple[float, ...]]:
    return {spec.buckets: getattr(config, spec.buckets) for spec in CATALOGUE if spec.buckets}


class Metrics:
    """The catalogue's collectors on one registry. Use :func:`metrics_for` to get the shared instance.

    Its two maps change together under :attr:`lock` (their readers on the hot path and at scrapes take a
    snapshot of the dict and do not lock); the families have prometheus_client's own locks."""

    def __init__(self, registry: CollectorRegistry, config: InstrumentConfig) -> None:
        self.registry = registry
        self.buckets = _bucket_config(config)
        #: Guards :attr:`model_series` and :attr:`live_models`.
        self.lock = threading.Lock()
        self._families: dict[str, MetricWrapperBase] = {}
        for spec in CATALOGUE:
            self._families[spec.name] = self._create(spec)
        # One collector for every family, which sets the oldest running requests' ages first (a value that
        # exists only when read) and formats only the series that moved (metrics/collector.py).
        registry.register(CatalogueCollector(list(self._families.values()), self._refresh_running_ages))
        self.errors = ErrorReporter(self[INSTRUMENTATION_ERRORS], config.error_log_interval_seconds)
        #: model label -> its bound series (inferwatch.instrumentation.metrics.model_series.series_for).
        self.model_series: dict[str, Any] = {}
        #: model label -> instrumented models of that name still alive (their live series stay while > 0).
        self.live_models: dict[str, int] = {}

    def _create(self, spec: MetricSpec) -> MetricWrapperBase:
        """The family, registered on no registry: :class:`CatalogueCollector` collects it."""
        common = {"name": spec.name, "documentation": spec.help, "labelnames": spec.labels, "registry": None}
        if spec.type == "counter":
            return Counter(**common)
        if spec.type == "gauge":
            return Gauge(multiprocess_mode=spec.multiprocess_mode, **common)
        return Histogram(buckets=self.buckets[spec.buckets], **common)

    def __getitem__(self, spec: MetricSpec) -> MetricWrapperBase:
        return self._families[spec.name]

    def _refresh_running_ages(self) -> None:
        """Every model's oldest running request's age, as of this scrape (series.ModelSeries)."""
        now = time.perf_counter()
        for series in tuple(self.model_series.values()):
            series.refresh_running_age(now)


_metrics_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, Metrics] = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def existing_metrics(registry: CollectorRegistry | None) -> Metrics | None:
    """The :class:`Metrics` of ``registry`` (default: REGISTRY) if a model or request created it."""
    with _metrics_lock:
        return _metrics_by_registry.get(REGISTRY if registry is None else registry)


def metrics_for(registry: CollectorRegistry | None, config: InstrumentConfig) -> Metrics:
    """The one :class:`Metrics` of ``registry`` (default: prometheus_client's REGISTRY), created on first
    use. Every model and tracked request on a registry shares its families (told apart by ``model``), so
    registering twice never collides; a different bucket configuration on the same registry is refused."""
    registry = REGISTRY if registry is None else registry
    with _metrics_lock:
        metrics = _metrics_by_registry.get(registry)
        if metrics is None:
            metrics = Metrics(registry, config)
            _metrics_by_registry[registry] = metrics
        elif metrics.buckets != _bucket_config(config):
            changed = sorted(k for k, v in _bucket_config(config).items() if metrics.buckets[k] != v)
            raise ValueError(
                f"this registry's llm_* histograms already exist with other buckets ({', '.join(changed)}): "
                "use the same InstrumentConfig buckets for every model on one registry, or another registry"
            )
        return metrics
