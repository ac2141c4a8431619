"""What one screen of ``inferwatch top`` shows, computed from two scrape rounds.

Instant values (utilization, SM activity, memory, power, clocks, temperatures, running and waiting
requests, the oldest running request's age, KV bytes, a paged KV cache's used blocks, busy ratio) come
from the later round. Rates (tokens/s, preemptions, CPU) and latency percentiles (TTFT, queue time, ITL)
come from the difference between the rounds: the percentiles are those of the tokens and requests that
completed in the window, from the histogram buckets that grew, not of everything since the process
started.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from inferwatch.monitor import queries as q
from inferwatch.monitor.checks.attribution import gpu_users, model_gpus
from inferwatch.monitor.checks.thresholds import default_thresholds
from inferwatch.monitor.expr import Expr, group_of
from inferwatch.monitor.scrape import Labels, Snapshot


@dataclass(frozen=True)
class EndpointRow:
    url: str
    instance: str
    up: bool
    error: str | None
    scrape_seconds: float
    samples: int


@dataclass(frozen=True)
class GpuRow:
    instance: str
    gpu: str
    uuid: str
    name: str | None
    up: float | None  # gpu_up: 0 when the exporter lost the GPU
    utilization: float | None
    sm_active: float | None  # GPM, on GPUs that have it: low while utilization is high means launch-bound
    memory_used_bytes: float | None
    memory_free_bytes: float | None
    memory_total_bytes: float | None
    power_watts: float | None
    power_limit_watts: float | None
    sm_clock_hz: float | None
    sm_clock_max_hz: float | None
    temperature_celsius: float | None
    slowdown_celsius: float | None
    throttle_reasons: tuple[str, ...]  # active clocks-event reasons that are throttling
    serving: tuple[str, ...]  # the models and pods on this GPU, joined by its UUID


@dataclass(frozen=True)
class ModelRow:
    instance: str
    model: str
    device: str | None
    gpu_uuid: str | None  # the GPU it runs on (llm_model_info's uuid); None on the CPU
    gpu: str | None  # that GPU's index on its exporter; None where no exporter of it is scraped
    gpu_instance: str | None  # that exporter
    gpu_sm_clock_ratio: float | None  # its GPU's SM clock / maximum
    gpu_throttle_reasons: tuple[str, ...]  # its GPU's active throttling reasons
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    queue_p99_seconds: float | None  # arrival at the server -> first forward, where the server reports it
    itl_p50_seconds: float | None
    itl_p99_seconds: float | None
    tokens_per_second: float | None
    requests_running: float | None
    requests_waiting: float | None  # arrived and not in generate yet, where the server reports it
    oldest_running_age_seconds: float | None  # since the oldest running request arrived; 0: none runs
    kv_cache_bytes: float | None
    kv_cache_headroom_tokens: float | None
    kv_blocks_used_ratio: float | None  # a paged KV cache (continuous batching): used / total blocks
    kv_preemptions_per_second: float | None  # requests its scheduler took off the device to free blocks
    busy_ratio: float | None
    # Speculative decoding (generate's assisted decoding): None where the model has no draft tokens' series.
    spec_draft_tokens_per_second: float | None = None
    spec_acceptance_ratio: float | None = None  # accepted / draft tokens; None where it drafted none
    # Why the requests of the window finished (finish_reason): shares of them; None where none finished.
    finished_stop_ratio: float | None = None
    finished_length_ratio: float | None = None  # max_tokens reached
    finished_cancelled_ratio: float | None = None
    finished_error_ratio: float | None = None
    finished_oom_ratio: float | None = None
    # At the HTTP edge, where the middleware reports it: arrival to the first content sent, the requests
    # cancelled (their clients went away) and the tokens generated for them after that, per second.
    first_content_p50_seconds: float | None = None
    first_content_p99_seconds: float | None = None
    cancelled_per_second: float | None = None
    wasted_tokens_per_second: float | None = None


@dataclass(frozen=True)
class HostRow:
    instance: str
    cpu_busy_ratio: float | None
    cpus: float | None
    memory_available_bytes: float | None
    memory_total_bytes: float | None


@dataclass(frozen=True)
class ProcessRow:
    instance: str
    pid: str
    comm: str
    cpu_cores: float | None
    resident_memory_bytes: float | None


@dataclass(frozen=True)
class Frame:
    window_seconds: float | None  # None for a first frame: no rates or percentiles yet
    endpoints: tuple[EndpointRow, ...]
    gpus: tuple[GpuRow, ...]
    models: tuple[ModelRow, ...]
    hosts: tuple[HostRow, ...]
    processes: tuple[ProcessRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_GPU_FIELDS: dict[str, Expr] = {
    "up": q.GPU_UP,
    "utilization": q.GPU_UTIL,
    "sm_active": q.SM_ACTIVE,
    "memory_used_bytes": q.GPU_MEMORY_USED,
    "memory_free_bytes": q.GPU_MEMORY_FREE,
    "memory_total_bytes": q.GPU_MEMORY_TOTAL,
    "power_watts": q.GPU_POWER,
    "power_limit_watts": q.GPU_POWER_LIMIT,
    "sm_clock_hz": q.SM_CLOCK,
    "sm_clock_max_hz": q.SM_CLOCK_MAX,
    "temperature_celsius": q.GPU_TEMPERATURE,
    "slowdown_celsius": q.GPU_SLOWDOWN_TEMPERATURE,
}
_MODEL_FIELDS: dict[str, Expr] = {
    "ttft_p50_seconds": q.TTFT_P50,
    "ttft_p99_seconds": q.TTFT_P99,
    "queue_p99_seconds": q.QUEUE_P99,
    "itl_p50_seconds": q.ITL_P50,
    "itl_p99_seconds": q.ITL_P99,
    "tokens_per_second": q.TOKENS_RATE,
    "requests_running": q.RUNNING,
    "requests_waiting": q.WAITING,
    "oldest_running_age_seconds": q.OLDEST_RUNNING_AGE,
    "kv_cache_bytes": q.KV_BYTES,
    "kv_cache_headroom_tokens": q.KV_HEADROOM,
    "kv_blocks_used_ratio": q.KV_BLOCKS_USED_SHARE,
    "kv_preemptions_per_second": q.KV_PREEMPTION_RATE,
    "busy_ratio": q.BUSY,
    "spec_draft_tokens_per_second": q.SPEC_DRAFT_RATE,
    "spec_acceptance_ratio": q.SPEC_ACCEPTANCE,
    "finished_stop_ratio": q.FINISHED_STOP,
    "finished_length_ratio": q.FINISHED_LENGTH,
    "finished_cancelled_ratio": q.FINISHED_CANCELLED,
    "finished_error_ratio": q.FINISHED_ERROR,
    "finished_oom_ratio": q.FINISHED_OOM,
    "first_content_p50_seconds": q.FIRST_CONTENT_P50,
    "first_content_p99_seconds": q.FIRST_CONTENT_P99,
    "cancelled_per_second": q.CANCELLED_RATE,
    "wasted_tokens_per_second": q.WASTED_TOKENS_RATE,
}
_HOST_FIELDS: dict[str, Expr] = {
    "cpus": q.HOST_CPUS,
    "memory_available_bytes": q.HOST_MEMORY_AVAILABLE,
    "memory_total_bytes": q.HOST_MEMORY_TOTAL,
}
_PROCESS_FIELDS: dict[str, Expr] = {"cpu_cores": q.PROCESS_CPU_RATE, "resident_memory_bytes": q.PROCESS_RSS}


def _table(fields: dict[str, Expr], earlier: Snapshot, later: Snapshot) -> dict[Labels, dict[str, float]]:
    """Group -> {field: value} for every group any field has a value for."""
    rows: defaultdict[Labels, dict[str, float]] = defaultdict(dict)
    for name, expr in fields.items():
        for group, value in expr.evaluate(earlier, later).items():
            rows[group][name] = value
    return rows


def _label_values(snapshot: Snapshot, metric: str, key: tuple[str, ...], label: str) -> dict[Labels, str]:
    """For info-style series: group -> the distinct values of ``label``, comma-joined."""
    found: defaultdict[Labels, set[str]] = defaultdict(set)
    for sample in snapshot.samples(metric):
        labels = dict(sample.labels)
        if labels.get(label):
            found[group_of(labels, key)].add(labels[label])
    return {group: ",".join(sorted(values)) for group, values in found.items()}


def _key(group: Labels, *names: str) -> tuple[str, ...]:
    labels = dict(group)
    return tuple(labels.get(name, "") for name in names)


def build_frame(earlier: Snapshot | None, later: Snapshot) -> Frame:
    """The frame for the window from ``earlier`` to ``later`` (instant values only without ``earlier``)."""
    # Against itself a snapshot yields gauges, and no rate or percentile (nothing happened in between).
    base = earlier or later
    endpoints = tuple(
        EndpointRow(e.url, e.instance, e.up, e.error, e.duration_s, len(e.samples)) for e in later.endpoints
    )

    gpu_values = _table(_GPU_FIELDS, base, later)
    names = _label_values(later, q.GPU_INFO.metric, q.GPU, "name")
    throttled: defaultdict[Labels, list[str]] = defaultdict(list)
    for group, value in q.CLOCK_EVENT_ACTIVE.evaluate(base, later).items():
        reason = dict(group)["reason"]
        if value > 0 and reason in default_thresholds().throttling_reasons:
            throttled[tuple(kv for kv in group if kv[0] != "reason")].append(reason)
    model_groups = q.MODEL_GPUS.evaluate(base, later)
    users = gpu_users(model_groups, q.GPU_PODS.evaluate(base, later))
    gpus = tuple(
        GpuRow(
            *_key(group, "instance", "gpu", "uuid"),
            name=names.get(group),
            throttle_reasons=tuple(sorted(throttled.get(group, ()))),
            serving=users.get(_key(group, "uuid")[0], ()),
            **{field: gpu_values[group].get(field) for field in _GPU_FIELDS},
        )
        for group in sorted(set(gpu_values) | set(names), key=lambda g: (_key(g, "instance"), _gpu_index(g)))
    )
    by_uuid = {row.uuid: row for row in gpus if row.uuid}

    model_values = _table(_MODEL_FIELDS, base, later)
    devices = _label_values(later, q.MODEL_INFO.metric, q.MODEL, "device")
    uuids = model_gpus(model_groups)
    models = []
    for group in sorted(set(model_values) | set(devices)):
        uuid = uuids.get(group)
        gpu = by_uuid.get(uuid or "")
        clock = (
            gpu.sm_clock_hz / gpu.sm_clock_max_hz if gpu and gpu.sm_clock_hz and gpu.sm_clock_max_hz else None
        )
        models.append(
            ModelRow(
                *_key(group, "instance", "model"),
                device=devices.get(group),
                gpu_uuid=uuid,
                gpu=gpu.gpu if gpu else None,
                gpu_instance=gpu.instance if gpu else None,
                gpu_sm_clock_ratio=clock,
                gpu_throttle_reasons=gpu.throttle_reasons if gpu else (),
                **{field: model_values[group].get(field) for field in _MODEL_FIELDS},
            )
        )

    host_values = _table(_HOST_FIELDS, base, later)
    cpu_total, cpu_idle = q.HOST_CPU_RATE.evaluate(base, later), q.HOST_CPU_IDLE_RATE.evaluate(base, later)
    hosts = tuple(
        HostRow(
            *_key(group, "instance"),
            cpu_busy_ratio=(
                1 - cpu_idle[group] / cpu_total[group] if cpu_total.get(group) and group in cpu_idle else None
            ),
            **{field: host_values[group].get(field) for field in _HOST_FIELDS},
        )
        for group in sorted(host_values)
    )

    process_values = _table(_PROCESS_FIELDS, base, later)
    processes = tuple(
        ProcessRow(
            *_key(group, "instance", "pid", "comm"),
            **{field: process_values[group].get(field) for field in _PROCESS_FIELDS},
        )
        for group in sorted(process_values)
    )
    window = later.time - earlier.time if earlier is not None else None
    return Frame(window, endpoints, gpus, tuple(models), hosts, processes)


def _gpu_index(group: Labels) -> int:
    index = dict(group).get("gpu", "")
    return int(index) if index.isdigit() else -1
