"""KV cache and memory: KV-cache bytes and headroom, the blocks and preemptions of a paged KV cache, the CUDA
allocator's memory, retries and OOMs."""

from __future__ import annotations

from inferwatch.common import names
from inferwatch.common.durations import parse_duration

from ..grafana import PanelSpec, Query, above, below, normal
from .queries import INSTANCE, SERVING, alert_settings, sel, summed


def kv_cache_bytes() -> PanelSpec:
    return PanelSpec(
        "KV cache",
        "Device bytes held by the KV caches of running requests.",
        "bytes",
        normal(),
        [Query(f"sum by (model) ({sel(names.LLM_KV_CACHE_BYTES, SERVING)})", "{{model}}")],
    )


def kv_cache_headroom() -> PanelSpec:
    limit = alert_settings("InferwatchKvCacheHeadroomLow")["headroom_tokens_below"]
    return PanelSpec(
        "KV-cache headroom",
        f"How many more KV-cache tokens fit in free device memory (with continuous batching: in the free "
        f"and prefix-cached blocks of the paged cache); InferwatchKvCacheHeadroomLow fires below {limit}.",
        "short",
        below(limit),
        [Query(f"min by (model) ({sel(names.LLM_KV_CACHE_HEADROOM_TOKENS, SERVING)})", "{{model}}")],
    )


def kv_cache_blocks_used() -> PanelSpec:
    limit = alert_settings("InferwatchKvCacheNearlyFull")["used_ratio_above"]
    used, prefix_cached, total = (
        f"sum by (model) ({sel(names.LLM_KV_CACHE_BLOCKS, SERVING, matcher)})"
        for matcher in ('state="used"', 'state="prefix_cached"', 'state="total"')
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
            Query(f"{used} / {total}", "{{model}}"),
            Query(f"{prefix_cached} / {total}", "{{model}} prefix-cached"),
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
        [Query(summed("rate", names.LLM_KV_CACHE_PREEMPTIONS_TOTAL, SERVING, "model"), "{{model}}")],
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
                f"sum by (instance, device, kind) ({sel(names.LLM_TORCH_MEMORY_BYTES, INSTANCE)})",
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
            Query(
                summed("increase", names.LLM_TORCH_ALLOC_RETRIES_TOTAL, INSTANCE, "instance, device"),
                "retries {{device}}",
            ),
            Query(
                summed("increase", names.LLM_OOM_EVENTS_TOTAL, SERVING, "model"),
                "OOMs {{model}}",
            ),
        ],
    )
