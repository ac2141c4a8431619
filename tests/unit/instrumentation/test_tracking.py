"""The request-tracking API for hand-written decode loops."""

from __future__ import annotations

import time

import pytest
import torch
from transformers.generation.utils import ALL_CACHE_NAMES

from inferwatch.instrumentation import RequestTracker, track_request
from tests.unit.instrumentation.conftest import batch_of, metric

STEP = 0.02


def test_tracked_request_feeds_the_request_metrics(registry) -> None:
    with track_request(model_name="hand", prompt_tokens=5, registry=registry) as req:
        assert isinstance(req, RequestTracker)
        time.sleep(STEP)
        req.token()  # first token
        assert metric(registry, "llm_requests_running", model="hand") == 1
        for _ in range(3):
            time.sleep(STEP)
            req.token()
        time.sleep(STEP)
        req.token(k=2)  # a step that yields two tokens: two observations of half the interval
    assert metric(registry, "llm_requests_total", model="hand", status="ok") == 1
    assert metric(registry, "llm_requests_running", model="hand") == 0
    assert metric(registry, "llm_prompt_tokens_total", model="hand") == 5
    assert metric(registry, "llm_generation_tokens_total", model="hand") == 6
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="hand") == 1
    assert metric(registry, "llm_time_to_first_token_seconds_sum", model="hand") >= STEP
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="hand") == 5
    itl_sum = metric(registry, "llm_inter_token_latency_seconds_sum", model="hand")
    decode = metric(registry, "llm_request_decode_seconds_sum", model="hand")
    assert 4 * STEP <= itl_sum == pytest.approx(decode)
    assert metric(registry, "llm_request_time_per_output_token_seconds_sum", model="hand") == pytest.approx(
        decode / 5
    )
    assert metric(registry, "llm_request_max_inter_token_latency_seconds_sum", model="hand") >= STEP
    assert metric(registry, "llm_last_step_timestamp_seconds", model="hand") == pytest.approx(
        time.time(), abs=5
    )
    # No forward ran: nothing is invented for it.
    assert metric(registry, "llm_forward_seconds_count", model="hand") == 0


@pytest.mark.parametrize(
    ("error", "status"),
    [(KeyError("lost"), "error"), (torch.cuda.OutOfMemoryError("CUDA out of memory."), "oom")],
)
def test_exception_in_a_tracked_block_is_counted_and_reraised(registry, error, status) -> None:
    with pytest.raises(type(error)) as caught, track_request(model_name="hand", registry=registry) as req:
        req.token()
        raise error
    assert caught.value is error
    assert metric(registry, "llm_requests_total", model="hand", status=status) == 1
    assert metric(registry, "llm_oom_events_total", model="hand") == (1 if status == "oom" else 0)
    assert metric(registry, "llm_requests_running", model="hand") == 0


def test_explicit_finish_and_misuse(registry) -> None:
    with track_request(model_name="hand", registry=registry) as req:
        req.token()
        req.finish("error")
        req.token()  # after finish: ignored
    assert metric(registry, "llm_requests_total", model="hand", status="error") == 1
    assert metric(registry, "llm_requests_total", model="hand", status="ok") == 0
    with pytest.raises(ValueError, match="k must be"):
        req.token(k=0)
    with pytest.raises(ValueError, match="status must be"):
        req.finish("done")
    with pytest.raises(ValueError, match="prompt_tokens"):
        track_request(model_name="hand", prompt_tokens=-1, registry=registry)
    with pytest.raises(ValueError, match="model_name"):
        track_request(model_name="", registry=registry)


def test_forwards_inside_a_tracked_request_are_attributed_to_it(llama, registry, instrumented) -> None:
    """A hand-written loop over an instrumented model: forward times and the KV cache go with the request,
    token times come from req.token()."""
    instrumented(llama, model_name="m")
    ids, _ = batch_of("hand loop")
    with torch.no_grad(), track_request(model_name="m", prompt_tokens=ids.shape[1], registry=registry) as req:
        out = llama(ids, use_cache=True)
        for _ in range(3):
            token = out.logits[:, -1:].argmax(-1)
            req.token()
            assert metric(registry, "llm_kv_cache_bytes", model="m") > 0
            cache = {ALL_CACHE_NAMES[0]: out[ALL_CACHE_NAMES[0]]}  # past_key_values, or cache since 5.2x
            out = llama(token, use_cache=True, **cache)
        req.token()
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="prefill") == 1
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == 3
    assert metric(registry, "llm_generation_tokens_total", model="m") == 4
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 3
    assert metric(registry, "llm_kv_cache_bytes", model="m") == 0


def test_forward_outside_any_request_is_timed_alone(gpt2, registry, instrumented) -> None:
    instrumented(gpt2, model_name="m")
    ids, _ = batch_of("no request", "at all")
    with torch.no_grad():
        gpt2(ids)
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="prefill") == 1
    assert metric(registry, "llm_batch_size_sum", model="m") == 2
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 0
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 0
