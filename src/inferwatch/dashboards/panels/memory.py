"""KV cache and memory: KV-cache bytes and headroom, the blocks and preemptions of a paged KV cache, the CUDA
allocator's memory, retries and OOMs."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_MODEL, PER_TARGET, eq

from ..grafana import PanelSpec, above, below, normal
from .queries import MODEL_LEGEND, alert_settings, per_model, per_model_rate, query, serving, serving_instance


def kv_cache_bytes() -> PanelSpec:
    return PanelSpec(
        "KV cache",
        "Device bytes held by the KV caches of running requests.",
        "bytes",
        normal(),
        [query(per_model("sum", names.LLM_KV_CACHE_BYTES), MODEL_LEGEND)],
    )


def kv_cache_headroom() -> PanelSpec:
    limit = alert_settings("InferwatchKvCacheHeadroomLow")["headroom_tokens_below"]
    return PanelSpec(
        "KV-cache headroom",
        f"How many more KV-cache tokens fit in free device memory (with continuous batching: in the free "
        f"and prefix-cached blocks of the paged cache); InferwatchKvCacheHeadroomLow fires below {limit}.",
        "short",
        below(limit),
        [query(per_model("min", names.LLM_KV_CACHE_HEADROOM_TOKENS), MODEL_LEGEND)],
    )


def kv_cache_blocks_used() -> PanelSpec:
    limit = alert_settings("InferwatchKvCacheNearlyFull")["used_ratio_above"]
    used, prefix_cached, total = (
        per_model("sum", names.LLM_KV_CACHE_BLOCKS, eq("state", state))
        for state in ("used", "prefix_cached", "total")
    )
    return PanelSpec(
        "KV-cache blocks used",
        "Share of the paged KV cache's blocks held by requests (continuous batching only; models served "
        "by generate have no blocks). The scheduler fills the cache under load; InferwatchKvCacheNearlyFull "
        f"fires above {limit:.0%} held for a while, when new requests wait for blocks and running ones "
        "get preempted. Prefix-cached: complete blocks no request holds, kept for prompts that start with "
        "the same tokens; the scheduler gives them to requests that need room.",
        "percentunit",
        above(limit),
        [
            query(used / total, MODEL_LEGEND),
            query(prefix_cached / total, f"{MODEL_LEGEND} prefix-cached"),
        ],
    )


def kv_cache_preemptions() -> PanelSpec:
    settings = alert_settings("InferwatchKvCachePreemptions")
    window = settings["window"]
    # Red from one preemption more than the alert's threshold per window: increase > N is increase >= N+1.
    events = settings["preemptions_above"] + 1
    return PanelSpec(
        "KV-cache preemptions",
        "Requests per second the continuous-batching scheduler took off the device to free KV-cache "
        "blocks; each one computes its prompt and tokens again. Red from "
        f"{events:g} per {window}: InferwatchKvCachePreemptions fires when that goes on.",
        "reqps",
        above(events / parse_duration(window, promql=True)),
        [query(per_model_rate(names.LLM_KV_CACHE_PREEMPTIONS_TOTAL), MODEL_LEGEND)],
    )


def allocator_memory() -> PanelSpec:
    return PanelSpec(
        "Allocator memory",
        "torch's CUDA caching allocator by kind: allocated (tensors), reserved (held from the driver), "
        "max_allocated (peak). A rising allocated floor at steady load is a leak.",
        "bytes",
        normal(),
        [
            query(
                promql.aggregate(
                    "sum", serving_instance(names.LLM_TORCH_MEMORY_BYTES), (*PER_TARGET, "device", "kind")
                ),
                "{{kind}} {{device}}",
            )
        ],
    )


def allocator_retries_and_ooms() -> PanelSpec:
    retries = alert_settings("InferwatchAllocatorRetries")
    return PanelSpec(
        "Allocator retries and OOMs",
        f"Allocations the CUDA allocator retried after freeing its cache (the early OOM signal; the alert "
        f"fires above {retries['retries_above']} per {retries['window']}) and out-of-memory errors.",
        "short",
        above(1),
        [
            query(
                promql.aggregate(
                    "sum",
                    promql.increase(serving_instance(names.LLM_TORCH_ALLOC_RETRIES_TOTAL)),
                    (*PER_TARGET, "device"),
                ),
                "retries {{device}}",
            ),
            query(
                promql.aggregate("sum", promql.increase(serving(names.LLM_OOM_EVENTS_TOTAL)), PER_MODEL),
                f"OOMs {MODEL_LEGEND}",
            ),
        ],
    )
