"""Continuous batching (``generate_batch``, the manager API) measured request by request.

A real tiny model runs transformers' own ``ContinuousBatchingManager`` on the CPU. What inferwatch reports
is compared with what the API returned in the same run: the outputs' token counts, and the manager's own
timestamps (``record_timestamps``: the host time each token reached its request, and ``created_time``).
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from inferwatch.instrumentation import InstrumentationHandle, instrument
from inferwatch.instrumentation.demo.models import build_model, encode_text
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from tests.support import sample_value
from tests.support.batching import small_page_pool
from tests.support.observations import ObservationRecorder
from tests.unit.instrumentation.conftest import wait_forgotten

pytestmark = pytest.mark.matrix

MODEL = "cb"
#: inferwatch's TTFT and E2E per request against the manager's own timestamps for it.
RELATIVE_TOLERANCE = 0.10

#: The field of a page's tokens: page_size since transformers 5.24, block_size before.
PAGE_SIZE = next(
    name
    for name in ("page_size", "block_size")
    if name in {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
)


def no_eos(max_new_tokens: int) -> GenerationConfig:
    # Greedy and without EOS: every request generates exactly what it asked for.
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1)


@pytest.fixture
def instrumented() -> Iterator[tuple[object, InstrumentationHandle, CollectorRegistry, ObservationRecorder]]:
    registry = CollectorRegistry()
    model = build_model("tiny-llama")
    handle = instrument(model, model_name=MODEL, registry=registry)
    try:
        yield model, handle, registry, ObservationRecorder(registry, handle, MODEL, ("ttft", "e2e", "itl"))
    finally:
        handle.remove()


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"model": MODEL, **labels}) or 0.0


def assert_close_each(what: str, ours: list[float], theirs: list[float]) -> None:
    ours, theirs = sorted(ours), sorted(theirs)
    assert len(ours) == len(theirs), (what, ours, theirs)
    for mine, truth in zip(ours, theirs, strict=True):
        assert abs(mine - truth) <= RELATIVE_TOLERANCE * truth, f"{what}: ours {ours}, manager's {theirs}"


def check_outputs(registry: CollectorRegistry, recorded: ObservationRecorder, outputs: list) -> None:
    """Requests, tokens, TTFT, ITL and E2E as the API returned them."""
    assert metric(registry, "llm_requests_total", status="ok") == len(outputs)
    prompt = sum(len(o.prompt_ids) for o in outputs)
    generated = sum(len(o.generated_tokens) for o in outputs)
    assert metric(registry, "llm_prompt_tokens_total") == prompt
    assert metric(registry, "llm_generation_tokens_total") == generated
    assert_close_each("TTFT", recorded.values["ttft"], [o.timestamps[0] - o.created_time for o in outputs])
    assert_close_each("E2E", recorded.values["e2e"], [o.lifespan[1] - o.created_time for o in outputs])
    assert len(recorded.values["itl"]) == generated - len(outputs)
    assert metric(registry, "llm_requests_running") == 0
    assert metric(registry, "llm_requests_waiting") == 0
    # Every prompt token is prefilled once (no preemption here), every later token is one decode token.
    assert metric(registry, "llm_step_tokens_sum", kind="prefill") == prompt
    assert metric(registry, "llm_step_tokens_sum", kind="decode") == generated - len(outputs)
    phases = ("prefill", "decode", "mixed")
    steps = sum(metric(registry, "llm_forward_seconds_count", phase=p) for p in phases)
    assert steps == metric(registry, "llm_batch_size_count") > 0
    assert metric(registry, "llm_request_queue_seconds_count") == len(outputs)


def test_generate_batch_requests_match_what_it_returned(instrumented) -> None:
    model, handle, registry, recorded = instrumented
    prompts = [encode_text("tell me more " * (1 + i % 5)) for i in range(8)]
    results = model.generate_batch(
        prompts,
        generation_config=no_eos(10),
        continuous_batching_config=small_page_pool(),
        record_timestamps=True,
    )
    assert handle.flush()
    check_outputs(registry, recorded, list(results.values()))


@pytest.mark.parametrize("streaming", [False, True])
def test_manager_requests_of_different_lengths(instrumented, streaming: bool) -> None:
    model, handle, registry, recorded = instrumented
    manager = model.init_continuous_batching(
        generation_config=no_eos(32), continuous_batching_config=small_page_pool()
    )
    manager.start()
    try:
        ids = [
            manager.add_request(
                encode_text("a prompt " * (1 + i)),
                max_new_tokens=4 + 3 * i,
                streaming=streaming,
                record_timestamps=True,
            )
            for i in range(6)
        ]
        outputs = []
        for request_id in ids:
            for output in manager.request_id_iter(request_id):
                if output.is_finished():
                    outputs.append(output)
                    break
    finally:
        manager.stop(block=True)
    assert handle.flush()
    assert sorted(len(o.generated_tokens) for o in outputs) == [4 + 3 * i for i in range(6)]
    check_outputs(registry, recorded, outputs)
    # While the steps ran, the running requests were counted; none is left over.
    assert metric(registry, "llm_kv_cache_preemptions_total") == 0


def test_a_cancelled_request_is_counted_cancelled(instrumented) -> None:
    model, handle, registry, _ = instrumented
    manager = model.init_continuous_batching(
        generation_config=no_eos(2000), continuous_batching_config=small_page_pool()
    )
    manager.start()
    try:
        long_id = manager.add_request(encode_text("a long story"), max_new_tokens=2000, streaming=True)
        for seen, _ in enumerate(manager.request_id_iter(long_id), start=1):
            if seen == 3:
                break
        manager.cancel_request(long_id)
        short_id = manager.add_request(encode_text("short"), max_new_tokens=3)
        short = next(o for o in manager.request_id_iter(short_id) if o.is_finished())
    finally:
        manager.stop(block=True)
    assert handle.flush()
    assert metric(registry, "llm_requests_total", status="cancelled") == 1
    assert metric(registry, "llm_requests_total", status="ok") == 1
    assert metric(registry, "llm_requests_total", status="error") == 0
    # The cancelled request's prompt and the tokens it got before it went away count; so do the other's.
    assert metric(registry, "llm_prompt_tokens_total") == len(encode_text("a long story")) + len(
        short.prompt_ids
    )
    assert metric(registry, "llm_generation_tokens_total") >= 3 + len(short.generated_tokens)
    assert metric(registry, "llm_requests_running") == 0


def test_a_failed_request_and_a_full_cache(instrumented) -> None:
    model, handle, registry, _ = instrumented
    # A cache of a few small pages for six requests that each outgrow their share: the scheduler must
    # take requests off the device to let the others finish.
    config = ContinuousBatchingConfig(**{PAGE_SIZE: 16}, num_blocks=6, max_batch_tokens=64)
    manager = model.init_continuous_batching(generation_config=no_eos(40), continuous_batching_config=config)
    manager.start()
    try:
        for _ in range(6):
            manager.add_request(encode_text("hello there " * 3), max_new_tokens=40)
        manager.add_request(encode_text("x"), max_new_tokens=4, not_a_processor_kwarg=3)  # refused
        results = [manager.get_result(timeout=120) for _ in range(7)]
    finally:
        manager.stop(block=True)
    assert handle.flush()
    assert sum(r.error is not None for r in results) == 1
    assert metric(registry, "llm_requests_total", status="ok") == 6
    assert metric(registry, "llm_requests_total", status="error") == 1
    assert metric(registry, "llm_kv_cache_preemptions_total") > 0
    assert metric(registry, "llm_requests_running") == metric(registry, "llm_requests_waiting") == 0
    assert not registry.get_sample_value("llm_instrumentation_errors_total", {"stage": "batching"})


def test_the_paged_cache_is_reported_and_forgotten_with_the_model() -> None:
    registry = CollectorRegistry()
    model = build_model("tiny-llama")
    handle = instrument(model, model_name=MODEL, registry=registry)
    manager = model.init_continuous_batching(
        generation_config=no_eos(4), continuous_batching_config=small_page_pool()
    )
    manager.start()
    manager.add_request(encode_text("hello"), max_new_tokens=4)
    assert manager.get_result(timeout=60) is not None
    series = series_for(metrics_for(registry, handle.config), MODEL)
    assert series.poll_paged_cache()  # what the background sampler does every poll interval
    total = metric(registry, "llm_kv_cache_blocks", state="total")
    assert total > 0 and metric(registry, "llm_kv_cache_blocks", state="used") <= total
    capacity = metric(registry, "llm_kv_cache_capacity_tokens")
    assert metric(registry, "llm_kv_cache_headroom_tokens") == capacity > 0

    collected = threading.Event()
    weakref.finalize(model, collected.set)
    manager.stop(block=True)
    del model, manager
    gc.collect()
    assert collected.is_set(), "continuous batching kept the instrumented model alive"
    wait_forgotten(registry, MODEL)
    exposition = generate_latest(registry).decode()
    assert sample_value(exposition, "llm_model_info") is None
    assert sample_value(exposition, "llm_kv_cache_blocks", state="total") is None


def test_removal_takes_the_continuous_batching_hook_off(instrumented) -> None:
    model, handle, registry, _ = instrumented
    assert "init_continuous_batching" in model.__dict__
    handle.remove()
    assert "init_continuous_batching" not in model.__dict__
    model.generate_batch(
        [encode_text("hello")], generation_config=no_eos(3), continuous_batching_config=small_page_pool()
    )
    assert metric(registry, "llm_requests_total", status="ok") == 0


def test_a_version_whose_manager_differs_keeps_the_steps(instrumented, monkeypatch, caplog) -> None:
    # A release without one of the request points: the requests go unmeasured, the reason is logged once
    # and counted, and the steps are still timed.
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    model, handle, registry, _ = instrumented
    monkeypatch.delattr(ContinuousBatchingManager, "cancel_request")
    with caplog.at_level("WARNING", logger="inferwatch.instrumentation"):
        model.generate_batch(
            [encode_text("hello"), encode_text("world")],
            generation_config=no_eos(4),
            continuous_batching_config=small_page_pool(),
        )
    assert handle.flush()
    assert [r.message for r in caplog.records if "requests are not followed" in r.message]
    errors = registry.get_sample_value("llm_instrumentation_errors_total", {"stage": "batching"})
    assert errors >= 1
    assert metric(registry, "llm_requests_total", status="ok") == 0
    assert metric(registry, "llm_batch_size_count") > 0
