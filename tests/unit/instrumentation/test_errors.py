"""Failures: inferwatch's own are contained and counted; the model's propagate unchanged and are counted."""

from __future__ import annotations

import traceback

import pytest
import torch

from inferwatch.instrumentation.metrics.model_series import series_for
from inferwatch.instrumentation.timing.request import DRAIN_BATCH
from tests.support.generation import generate_greedy
from tests.unit.instrumentation.conftest import batch_of, metric

pytestmark = pytest.mark.matrix


class RaiseOnDecode:
    """A forward hook on a submodule raising ``error`` at its n-th call: the model failing mid-request."""

    def __init__(self, module: torch.nn.Module, error: BaseException, at_call: int = 2) -> None:
        self.error, self.at_call, self.calls = error, at_call, 0
        self.handle = module.register_forward_hook(self)

    def __call__(self, module, args, output):
        self.calls += 1
        if self.calls == self.at_call:
            raise self.error


def test_model_exception_propagates_unchanged_and_is_counted(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m")
    error = ValueError("the model broke")
    failing = RaiseOnDecode(llama.model.layers[0].mlp, error)
    try:
        with pytest.raises(ValueError) as caught:
            generate_greedy(llama, *batch_of("errors", "happen"), new_tokens=4)
    finally:
        failing.handle.remove()
    assert caught.value is error
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "__call__"  # raised where the model raised it
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="error") == 1
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 0
    assert metric(registry, "llm_oom_events_total", model="m") == 0
    assert metric(registry, "llm_requests_running", model="m") == 0
    assert metric(registry, "llm_e2e_request_latency_seconds_count", model="m", outcome="ok") == 0
    assert metric(registry, "llm_instrumentation_errors_total") is None
    # The model works again afterwards and is counted normally.
    generate_greedy(llama, *batch_of("errors", "happen"), new_tokens=4)
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes."),
    ],
    ids=["cuda", "cpu-allocator"],
)
def test_simulated_oom_is_counted_then_reraised(gpt2, registry, instrumented, error) -> None:
    handle = instrumented(gpt2, model_name="m")
    failing = RaiseOnDecode(gpt2.transformer.h[1].mlp, error, at_call=3)
    try:
        with pytest.raises(type(error)) as caught:
            generate_greedy(gpt2, *batch_of("errors", "happen"), new_tokens=4)
    finally:
        failing.handle.remove()
    assert caught.value is error
    assert handle.flush()
    assert metric(registry, "llm_oom_events_total", model="m") == 1
    assert metric(registry, "llm_requests_total", model="m", status="oom") == 1
    assert metric(registry, "llm_requests_running", model="m") == 0
    # The steps that completed before the failure were still timed.
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 1


def test_internal_error_is_contained_and_counted(llama, registry, instrumented, monkeypatch, caplog) -> None:
    ids, mask = batch_of("contained")
    # More steps than a drain batch, so the broken observer runs inside the forward hook.
    new_tokens = DRAIN_BATCH + 4
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    handle = instrumented(llama, model_name="m")
    series = series_for(handle._instrumentation.model.metrics, "m")

    def broken_observe(value: float) -> None:
        raise ZeroDivisionError("an inferwatch bug")

    monkeypatch.setattr(series.ttft, "observe", broken_observe)
    with caplog.at_level("WARNING", logger="inferwatch.instrumentation"):
        out = llama.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
        out_again = llama.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    assert handle.flush()
    assert torch.equal(out, expected) and torch.equal(out_again, expected)
    errors = metric(registry, "llm_instrumentation_errors_total", stage="forward_post")
    assert errors is not None and errors >= 2
    logged = [r for r in caplog.records if "inferwatch internal error" in r.getMessage()]
    assert len(logged) == 1  # rate-limited: one report per stage per interval
    assert "ZeroDivisionError" in caplog.text
    # Everything that does not depend on the broken observer is still right.
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 2
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * new_tokens * ids.shape[0]


def test_error_in_the_exit_path_is_contained(gpt2, registry, instrumented, monkeypatch) -> None:
    handle = instrumented(gpt2, model_name="m")

    def broken(*args, **kwargs):
        raise RuntimeError("counting failed")

    monkeypatch.setattr(handle._instrumentation.generate, "_token_counts", broken)
    out = generate_greedy(gpt2, *batch_of("errors", "happen"), new_tokens=4)
    assert out.shape[1] > 0
    assert handle.flush()
    assert metric(registry, "llm_instrumentation_errors_total", stage="generate_exit") == 1
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1
    assert metric(registry, "llm_requests_running", model="m") == 0
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 1
    # Counted as they were produced (min_new_tokens: both rows generate every step); the output that
    # would settle them could not be counted, so no per-request token observation.
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * 4
    assert metric(registry, "llm_request_generation_tokens_count", model="m") == 0
