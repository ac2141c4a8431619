"""A simulated serving process and GPU exporter for the diagnosis checks.

Both are real prometheus_client metrics with the catalogue's names; each step changes them as a process
in that state would, and is scraped at a chosen time, so every expected figure follows from the
simulation's parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inferwatch.alerts.config import merge_config
from inferwatch.monitor.checks import Diagnosis, Thresholds, diagnose
from inferwatch.monitor.diagnose import ScrapeSource
from tests.unit.monitor.snapshots import endpoint, snapshot

SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class Serving:
    """An instrumented serving process of one model."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        m = ["model"]
        self.itl = Histogram("llm_inter_token_latency_seconds", "", m, buckets=SECONDS_BUCKETS, registry=r)
        self.ttft = Histogram("llm_time_to_first_token_seconds", "", m, buckets=SECONDS_BUCKETS, registry=r)
        self.prefill = Histogram("llm_request_prefill_seconds", "", m, buckets=SECONDS_BUCKETS, registry=r)
        self.queue = Histogram("llm_request_queue_seconds", "", m, buckets=SECONDS_BUCKETS, registry=r)
        self.waiting = Gauge("llm_requests_waiting", "", m, registry=r)
        self.batch = Histogram("llm_batch_size", "", m, buckets=TOKEN_BUCKETS, registry=r)
        self.prompt = Histogram("llm_request_prompt_tokens", "", m, buckets=TOKEN_BUCKETS, registry=r)
        self.generated = Histogram("llm_request_generation_tokens", "", m, buckets=TOKEN_BUCKETS, registry=r)
        self.tokens = Counter("llm_generation_tokens", "", m, registry=r)
        self.ooms = Counter("llm_oom_events", "", m, registry=r)
        self.running = Gauge("llm_requests_running", "", m, registry=r)
        d = ["model", "device", "uuid"]  # the model's GPU is the exporter's GPU 0, by its UUID
        self.busy = Gauge("llm_gpu_busy_ratio", "", d, registry=r)
        self.bandwidth = Gauge("llm_decode_bandwidth_utilization_ratio", "", d, registry=r)
        self.headroom = Gauge("llm_kv_cache_headroom_tokens", "", m, registry=r)
        self.blocks = Gauge("llm_kv_cache_blocks", "", ["model", "state"], registry=r)
        self.preemptions = Counter("llm_kv_cache_preemptions", "", m, registry=r)
        self.rss = Gauge("process_resident_memory_bytes", "", registry=r)
        Gauge("llm_model_info", "", d, registry=r).labels("m", "cuda:0", "GPU-0").set(1)

    def step(
        self,
        *,
        itl: float = 0.010,
        tokens: int = 100,
        batch: int = 1,
        busy: float = 0.9,
        running: int = 1,
        requests: int = 4,
        prompt: int = 64,
        prefill: float = 0.020,
        rss: float = 1e9,
        ooms: int = 0,
        bandwidth: float | None = None,
        headroom: float | None = None,
        queue: float | None = None,
        waiting: int | None = None,
        blocks_used: int | None = None,
        blocks_total: int = 1000,
        preemptions: int | None = None,
    ) -> None:
        for _ in range(tokens):
            self.itl.labels("m").observe(itl)
            self.batch.labels("m").observe(batch)
        for _ in range(requests):
            # With an arrival (queue given), time to first token is queue time plus prefill.
            self.ttft.labels("m").observe(prefill + (queue or 0.0))
            if queue is not None:
                self.queue.labels("m").observe(queue)
            self.prefill.labels("m").observe(prefill)
            self.prompt.labels("m").observe(prompt)
            self.generated.labels("m").observe(tokens / requests)
        self.tokens.labels("m").inc(tokens)
        self.ooms.labels("m").inc(ooms)
        self.running.labels("m").set(running)
        self.busy.labels("m", "cuda:0", "GPU-0").set(busy)
        self.rss.set(rss)
        if bandwidth is not None:
            self.bandwidth.labels("m", "cuda:0", "GPU-0").set(bandwidth)
        if headroom is not None:
            self.headroom.labels("m").set(headroom)
        if waiting is not None:
            self.waiting.labels("m").set(waiting)
        # A paged KV cache (continuous batching): its blocks, and requests the scheduler preempted.
        if blocks_used is not None:
            self.blocks.labels("m", "used").set(blocks_used)
            self.blocks.labels("m", "total").set(blocks_total)
        if preemptions is not None:
            self.preemptions.labels("m").inc(preemptions)


class Gpus:
    """The exporter's view of one GPU."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        g = ["gpu", "uuid"]
        self.active = Gauge("gpu_clocks_event_active", "", [*g, "reason"], registry=r)
        self.throttled = Counter("gpu_clocks_event_seconds", "", [*g, "reason"], registry=r)
        self.free = Gauge("gpu_memory_free_bytes", "", g, registry=r)
        self.total = Gauge("gpu_memory_total_bytes", "", g, registry=r)
        self.used = Gauge("gpu_memory_used_bytes", "", g, registry=r)
        self.clock = Gauge("gpu_clock_hz", "", [*g, "clock"], registry=r)
        self.clock_max = Gauge("gpu_clock_max_hz", "", [*g, "clock"], registry=r)
        self.utilization = Gauge("gpu_utilization_ratio", "", g, registry=r)
        gpm = [*g, "gpu_instance"]
        self.sm_active = Gauge("gpu_sm_active_ratio", "", gpm, registry=r)
        self.graphics_active = Gauge("gpu_graphics_active_ratio", "", gpm, registry=r)
        self.tensor_active = Gauge("gpu_tensor_active_ratio", "", gpm, registry=r)
        self.fp32_active = Gauge("gpu_fp32_active_ratio", "", gpm, registry=r)
        # The exporter's view of the serving process: on the GPU, and its CPU.
        process_memory = Gauge("gpu_process_memory_bytes", "", [*g, "pid", "comm"], registry=r)
        process_memory.labels("0", "GPU-0", "4242", "python3").set(2e9)
        self.process_cpu = Counter("inferwatch_process_cpu_seconds", "", ["pid", "comm", "mode"], registry=r)
        self.total.labels("0", "GPU-0").set(80e9)
        self.clock_max.labels("0", "GPU-0", "sm").set(1980e6)

    def step(
        self,
        *,
        reasons: tuple[str, ...] = (),
        throttle_duty: float = 0.0,
        free: float = 40e9,
        process_cpu: float = 0.3,
        utilization: float = 0.9,
        sm_active: float | None = 0.85,
        graphics_active: float = 0.9,
        tensor_active: float = 0.6,
        fp32_active: float = 0.02,
    ) -> None:
        """``sm_active`` None: a GPU without GPM (before Hopper), which has none of its series."""
        self.process_cpu.labels("4242", "python3", "user").inc(process_cpu)
        self.utilization.labels("0", "GPU-0").set(utilization)
        if sm_active is not None:
            self.sm_active.labels("0", "GPU-0", "").set(sm_active)
            self.graphics_active.labels("0", "GPU-0", "").set(graphics_active)
            self.tensor_active.labels("0", "GPU-0", "").set(tensor_active)
            self.fp32_active.labels("0", "GPU-0", "").set(fp32_active)
        for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown"):
            self.active.labels("0", "GPU-0", reason).set(1 if reason in reasons else 0)
        self.throttled.labels("0", "GPU-0", "sw_power_cap").inc(throttle_duty)
        self.free.labels("0", "GPU-0").set(free)
        self.used.labels("0", "GPU-0").set(80e9 - free)
        self.clock.labels("0", "GPU-0", "sm").set(1980e6 * (0.7 if reasons else 1.0))


def run(
    steps: int,
    serving: Callable[[int], dict] | None = None,
    gpus: Callable[[int], dict] | None = None,
    alerts: dict | None = None,
) -> Diagnosis:
    """Scrape after each of ``steps`` one-second steps and diagnose the history, with the thresholds of
    the alert configuration ``alerts`` (overrides of the defaults)."""
    process, gpu = Serving(), Gpus()
    snapshots = []
    for i in range(steps):
        scraped = []
        if serving is not None:
            process.step(**serving(i))
            scraped.append(endpoint(process.registry, float(i), "node:8797"))
        if gpus is not None:
            gpu.step(**gpus(i))
            scraped.append(endpoint(gpu.registry, float(i), "node:8798"))
        snapshots.append(snapshot(*scraped))
    return diagnose(ScrapeSource(snapshots, "1s"), Thresholds.from_alerts(merge_config(alerts or {})))
