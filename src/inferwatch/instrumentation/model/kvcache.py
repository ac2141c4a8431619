"""KV-cache size from the shapes of a forward's returned cache: metadata only, never tensor data.

transformers 5.17 returns the cache as ``past_key_values``, later 5.x releases as ``cache``; the cache is
a ``Cache`` whose ``layers`` hold ``keys``/``values`` tensors (5.x), or ``key_cache``/``value_cache``
lists (4.x), or a legacy tuple of ``(key, value)`` pairs. Static layers are preallocated for
``max_cache_len`` tokens, which is what their tensors' shapes already say.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from inferwatch.instrumentation.metrics.model_series import KVCacheSize

_OUTPUT_CACHE_NAMES = ("cache", "past_key_values")


def output_cache(output: Any) -> Any:
    """The cache a model forward returned, under either name; None when there is none."""
    if isinstance(output, dict):  # ModelOutput is an OrderedDict holding only the fields that are set
        for name in _OUTPUT_CACHE_NAMES:
            cache = output.get(name)
            if cache is not None:
                return cache
    return None


def _layer_tensors(cache: Any) -> Iterator[tuple[torch.Tensor | None, torch.Tensor | None, bool]]:
    """(keys, values, is_static) per layer."""
    inner = getattr(cache, "self_attention_cache", None)  # EncoderDecoderCache: the decoder's own cache
    if inner is not None:
        cache = inner
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            static = hasattr(layer, "max_cache_len")
            yield getattr(layer, "keys", None), getattr(layer, "values", None), static
        return
    key_cache = getattr(cache, "key_cache", None)
    if key_cache is not None:
        static = hasattr(cache, "max_cache_len")
        for keys, values in zip(key_cache, cache.value_cache, strict=False):
            yield keys, values, static
        return
    if isinstance(cache, (tuple, list)):
        for pair in cache:
            if isinstance(pair, (tuple, list)) and len(pair) >= 2:
                yield pair[0], pair[1], False


def measure(cache: Any) -> KVCacheSize | None:
    """Size of ``cache`` from tensor shapes; None when it holds no key/value tensors (yet)."""
    total = 0
    per_token = 0.0
    capacity = 0
    static = False
    for keys, values, is_static in _layer_tensors(cache):
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.dim() < 3:
            continue
        layer_bytes = keys.nbytes + values.nbytes
        batch, slots = keys.shape[0], keys.shape[-2]
        total += layer_bytes
        if batch and slots:
            per_token += layer_bytes / (batch * slots)
        if is_static:
            static = True
            capacity = max(capacity, batch * slots)
    if not total:
        return None
    return KVCacheSize(total, per_token, capacity if static else None)
