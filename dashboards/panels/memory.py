"""KV cache and memory: KV-cache bytes and headroom, the CUDA allocator's memory, retries and OOMs."""

from __future__ import annotations

from inferwatch.common import names

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
        f"How many more KV-cache tokens fit in free device memory; InferwatchKvCacheHeadroomLow fires "
        f"below {limit}.",
        "short",
        below(limit),
        [Query(f"min by (model) ({sel(names.LLM_KV_CACHE_HEADROOM_TOKENS, SERVING)})", "{{model}}")],
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
