"""The paged KV cache of continuous batching, figure by figure: bytes per token exact, the blocks running
requests hold apart from those the prefix cache keeps, headroom, the pool in bytes, and prefix-cache hits.

A real model runs transformers' own ``ContinuousBatchingManager`` on the CPU. Bytes per token are compared
with the generate path's figure for the same model (measured from the returned cache's shapes) and with the
config's arithmetic, exactly. The cache's blocks are compared with what transformers does with them: a
request's prompt fills pages of 256 tokens, a complete page is hashed and, once no request holds it, kept
for the next request that starts with the same tokens; a request that needs the room gets it instead.
transformers 5.17 calls a page a block (``block_size``), 5.24 a page (``page_size``).

While a request runs, its forward passes are held at a gate, so the manager's bookkeeping cannot change
while the test reads it, as the background sampler does every poll interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from inferwatch.instrumentation import InstrumentationHandle, instrument
from inferwatch.instrumentation.demo.models import build_model, encode_text
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for

pytestmark = pytest.mark.matrix

MODEL = "paged"
PAGE = 256  # tokens of one page (one block of every layer), transformers' default
#: The page-size argument of this transformers release.
_FIELDS = {field.name for field in dataclasses.fields(ContinuousBatchingConfig)}
PAGE_FIELD = "page_size" if "page_size" in _FIELDS else "block_size"
# 300 tokens: one complete page (hashed, shareable) and 44 tokens of a second; with up to 200 generated
# tokens the request never needs a third page.
SHARED_PROMPT = encode_text("x" * 299)


def paged_config(num_blocks: int | None, **kwargs: Any) -> ContinuousBatchingConfig:
    """A pool of ``num_blocks`` pages of PAGE tokens, for steps of up to 1024 tokens. None: transformers
    sizes the pool itself, here from 0.5 % of the host's memory. Both are set because on the CPU
    transformers 5.17 otherwise sizes whichever is missing from 80-90 % of the host's memory."""
    kwargs = {"max_batch_tokens": 1024, **kwargs}
    if num_blocks is None:
        kwargs.setdefault("max_memory_percent", 0.005)
    return ContinuousBatchingConfig(num_blocks=num_blocks, **{PAGE_FIELD: PAGE}, **kwargs)


def no_eos(max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1)


def per_token_by_config(model: torch.nn.Module) -> int:
    """Bytes one cached token of one sequence takes: layers x (keys, values) x KV heads x head dim x dtype."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * model.dtype.itemsize


def paged_figures(registry: CollectorRegistry, handle: InstrumentationHandle) -> dict[str, float | None]:
    """What the background sampler reports of the paged cache, read now (None: no such series)."""
    assert series_for(metrics_for(registry, handle.config), MODEL).poll_paged_cache()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": MODEL, **labels})

    return {
        "bytes_per_token": value("llm_kv_cache_bytes_per_token"),
        "capacity_tokens": value("llm_kv_cache_capacity_tokens"),
        "capacity_bytes": value("llm_kv_cache_capacity_bytes"),
        "bytes": value("llm_kv_cache_bytes"),
        "blocks_used": value("llm_kv_cache_blocks", state="used"),
        "blocks_prefix_cached": value("llm_kv_cache_blocks", state="prefix_cached"),
        "blocks_total": value("llm_kv_cache_blocks", state="total"),
        "headroom_tokens": value("llm_kv_cache_headroom_tokens"),
    }


def prefix_tokens(registry: CollectorRegistry) -> dict[str, float | None]:
    """Prompt tokens looked up in the prefix cache, by result."""
    name = "llm_kv_cache_prefix_tokens_total"
    return {
        result: registry.get_sample_value(name, {"model": MODEL, "result": result})
        for result in ("hit", "miss")
    }


class Gate:
    """A forward pre-hook on the model that, while closed, holds the thread that runs the next forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._open = threading.Event()
        self._open.set()
        self._holding = threading.Event()
        self._hook = model.register_forward_pre_hook(self._wait)

    def _wait(self, module: torch.nn.Module, args: Any) -> None:
        if not self._open.is_set():
            self._holding.set()
            self._open.wait(120)

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        """Close the gate and wait until the manager's thread waits at it; open it again on leaving."""
        self._holding.clear()
        self._open.clear()
        try:
            assert self._holding.wait(60), "the manager ran no further forward"
            yield
        finally:
            self._open.set()

    def remove(self) -> None:
        self._open.set()
        self._hook.remove()


@pytest.fixture
def instrumented() -> Iterator[tuple[torch.nn.Module, InstrumentationHandle, CollectorRegistry]]:
    registry = CollectorRegistry()
    model = build_model("tiny-llama")
    handle = instrument(model, model_name=MODEL, registry=registry)
    try:
        yield model, handle, registry
    finally:
        handle.remove()


def finished(outputs: Iterator[Any]) -> Any:
    output = next(o for o in outputs if o.is_finished())
    assert output.error is None, output.error
    return output


@pytest.mark.parametrize(
    ("name", "dtype"), [("tiny-llama", torch.float32), ("small-llama", torch.bfloat16)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize("num_blocks", [None, 4], ids=["auto-sized-pool", "4-blocks"])
def test_bytes_per_token_are_the_generate_paths_and_the_configs(
    name: str, dtype: torch.dtype, num_blocks: int | None
) -> None:
    model = build_model(name, dtype=dtype)
    by_config = per_token_by_config(model)
    prompt = encode_text("bytes per token")

    generate_registry = CollectorRegistry()
    handle = instrument(model, model_name=MODEL, registry=generate_registry)
    try:
        ids = torch.tensor([prompt])
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert handle.flush()
        by_generate = generate_registry.get_sample_value("llm_kv_cache_bytes_per_token", {"model": MODEL})
    finally:
        handle.remove()

    registry = CollectorRegistry()
    handle = instrument(model, model_name=MODEL, registry=registry)
    try:
        manager = model.init_continuous_batching(
            generation_config=no_eos(3), continuous_batching_config=paged_config(num_blocks)
        )
        manager.start()
        try:
            finished(manager.request_id_iter(manager.add_request(prompt, max_new_tokens=3)))
            paged = paged_figures(registry, handle)
        finally:
            manager.stop(block=True)
    finally:
        handle.remove()

    # tiny-llama in float32: 512 bytes; small-llama in bfloat16: 4096 (issue 24's model).
    assert (paged["bytes_per_token"], by_generate) == (by_config, by_config)
    # The pool, without the two padding blocks (5.17) or sectors (5.24) transformers adds for padding tokens.
    total = paged["blocks_total"]
    assert total == (num_blocks or total) > 0
    assert paged["capacity_tokens"] == total * PAGE
    assert paged["capacity_bytes"] == total * PAGE * by_config
    # The prompt (16 tokens) completes no page: nothing is kept for the prefix cache.
    assert (paged["blocks_used"], paged["blocks_prefix_cached"]) == (0, 0)
    assert paged["headroom_tokens"] == paged["capacity_tokens"]


def test_running_requests_and_the_prefix_cache_hold_blocks_apart(instrumented) -> None:
    model, handle, registry = instrumented
    per_token = per_token_by_config(model)  # 512 bytes
    gate = Gate(model)
    manager = model.init_continuous_batching(
        generation_config=no_eos(200), continuous_batching_config=paged_config(4)
    )
    manager.start()
    try:
        # A 300-token prompt takes 2 of the 4 pages while it runs; its first page is complete.
        first = manager.add_request(SHARED_PROMPT, max_new_tokens=200, streaming=True)
        outputs = manager.request_id_iter(first)
        for seen, _ in enumerate(outputs, start=1):
            if seen == 3:
                break
        with gate.closed():
            running = paged_figures(registry, handle)
        finished(outputs)
        idle = paged_figures(registry, handle)

        # The same prompt again: its first page comes from the prefix cache, the other 44 tokens are computed.
        finished(manager.request_id_iter(manager.add_request(SHARED_PROMPT, max_new_tokens=4)))
        hits = prefix_tokens(registry)

        # A 900-token prompt needs all 4 pages while one is kept for the prefix cache: transformers gives
        # that page to the request (it evicts the cached page) instead of preempting or refusing it.
        long_id = manager.add_request(encode_text("y" * 899), max_new_tokens=4)
        long = finished(manager.request_id_iter(long_id))
        after_long = paged_figures(registry, handle)
    finally:
        gate.remove()
        manager.stop(block=True)

    pool = {"bytes_per_token": per_token, "capacity_tokens": 4 * PAGE, "capacity_bytes": 4 * PAGE * per_token}
    assert running == {
        **pool,
        "bytes": 2 * PAGE * per_token,
        "blocks_used": 2,
        "blocks_prefix_cached": 0,  # the complete page is the running request's
        "blocks_total": 4,
        "headroom_tokens": 2 * PAGE,
    }
    # At idle the complete page stays cached, held by no request; it counts in the headroom, as the free
    # pages do, because a request that needs it gets it (below).
    assert idle == {
        **pool,
        "bytes": 0,
        "blocks_used": 0,
        "blocks_prefix_cached": 1,
        "blocks_total": 4,
        "headroom_tokens": 4 * PAGE,
    }
    assert hits == {"hit": PAGE, "miss": len(SHARED_PROMPT) + len(SHARED_PROMPT) - PAGE}
    assert len(long.generated_tokens) == 4
    assert registry.get_sample_value("llm_kv_cache_preemptions_total", {"model": MODEL}) == 0
    # Its 3 complete pages are what the prefix cache keeps now (the first prompt's page was evicted).
    assert after_long == {**idle, "blocks_prefix_cached": 3}
    assert prefix_tokens(registry) == {"hit": PAGE, "miss": hits["miss"] + 900}


def test_without_block_sharing_there_is_no_prefix_cache(instrumented) -> None:
    model, handle, registry = instrumented
    manager = model.init_continuous_batching(
        generation_config=no_eos(4), continuous_batching_config=paged_config(4, allow_block_sharing=False)
    )
    manager.start()
    try:
        for _ in range(2):
            finished(manager.request_id_iter(manager.add_request(SHARED_PROMPT, max_new_tokens=4)))
        idle = paged_figures(registry, handle)
    finally:
        manager.stop(block=True)
    assert (idle["blocks_used"], idle["blocks_prefix_cached"], idle["headroom_tokens"]) == (0, 0, 4 * PAGE)
    # No lookups, so no hit or miss series: a hit ratio of 0 would say the cache was tried.
    assert prefix_tokens(registry) == {"hit": None, "miss": None}
