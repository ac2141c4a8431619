"""KV-cache sizes from cache shapes: dynamic and static caches, batch > 1, live while requests run."""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import ALL_CACHE_NAMES

from inferwatch.instrumentation.model.kvcache import measure, output_cache
from tests.unit.instrumentation.conftest import batch_of, metric

pytestmark = pytest.mark.matrix


def bytes_per_token(model: torch.nn.Module) -> int:
    """Keys + values of one token of one sequence, from the config alone."""
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * layers * heads * head_dim * 4  # float32


class LiveScrape(BaseStreamer):
    """Scrapes the registry from inside generate at every step (what Prometheus would see mid-request)."""

    def __init__(self, registry, names: tuple[str, ...]) -> None:
        self.registry, self.names, self.seen = registry, names, []

    def put(self, value: torch.Tensor) -> None:
        self.seen.append({name: metric(self.registry, name, model="m") for name in self.names})

    def end(self) -> None:
        pass


def test_dynamic_cache_bytes_while_running(model, registry, instrumented) -> None:
    instrumented(model, model_name="m")
    ids, mask = batch_of("kv cache", "grows by a token per step")
    live = LiveScrape(
        registry, ("llm_kv_cache_bytes", "llm_kv_cache_bytes_per_token", "llm_requests_running")
    )
    model.generate(
        ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, streamer=live
    )
    per_token = bytes_per_token(model)
    batch, prompt = ids.shape
    # put() #2 follows the prefill: the cache holds the prompt; #3 follows the first decode step.
    assert live.seen[1]["llm_kv_cache_bytes"] == per_token * batch * prompt
    assert live.seen[2]["llm_kv_cache_bytes"] == per_token * batch * (prompt + 1)
    assert live.seen[2]["llm_kv_cache_bytes_per_token"] == per_token
    assert live.seen[2]["llm_requests_running"] == 1
    assert metric(registry, "llm_kv_cache_bytes", model="m") == 0
    assert metric(registry, "llm_requests_running", model="m") == 0
    assert metric(registry, "llm_kv_cache_capacity_tokens", model="m") == 0


def test_static_cache_capacity(llama, registry, instrumented) -> None:
    instrumented(llama, model_name="m")
    ids, mask = batch_of("static", "caches", "are preallocated")
    cache = StaticCache(config=llama.config, max_cache_len=64)
    live = LiveScrape(registry, ("llm_kv_cache_bytes", "llm_kv_cache_capacity_tokens"))
    # The cache argument's name differs between transformers releases (past_key_values, then cache).
    cache_argument = {ALL_CACHE_NAMES[0]: cache}
    llama.generate(
        ids, attention_mask=mask, max_new_tokens=4, do_sample=False, streamer=live, **cache_argument
    )
    batch = ids.shape[0]
    assert live.seen[-1]["llm_kv_cache_capacity_tokens"] == 64 * batch
    assert live.seen[-1]["llm_kv_cache_bytes"] == 64 * batch * bytes_per_token(llama)
    assert metric(registry, "llm_kv_cache_capacity_tokens", model="m") == 0


def test_measure_reads_every_cache_layout(llama) -> None:
    ids, _ = batch_of("layouts", "of caches")
    with torch.no_grad():
        output = llama(ids, use_cache=True)
    cache = output_cache(output)
    size = measure(cache)
    expected = bytes_per_token(llama) * ids.numel()
    assert size is not None and size.bytes == expected and size.capacity_tokens is None
    legacy = tuple((layer.keys, layer.values) for layer in cache.layers)
    assert measure(legacy) == size
    assert measure(None) is None and measure(()) is None
