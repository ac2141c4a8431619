"""Timing on the CPU path: with forwards of known duration, the latencies come out as defined."""

from __future__ import annotations

import time

import pytest
import torch

from inferwatch.instrumentation.timing.arrival import Arrival
from tests.unit.instrumentation.conftest import batch_of, metric

# Forwards slowed by sleeps, and latencies bounded by the wall time they took: the timing tier's.
pytestmark = pytest.mark.timing

PREFILL_DELAY = 0.06
DECODE_DELAY = 0.02
NEW_TOKENS = 5


class SlowForward:
    """A forward pre-hook registered after inferwatch's, so its sleep is part of the timed forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        time.sleep(PREFILL_DELAY if ids.shape[1] > 1 else DECODE_DELAY)


@pytest.fixture
def slow_request(model, registry, instrumented):
    ids, mask = batch_of("timing")
    # A model's first generate pays one-off set-up costs inside TTFT; time a warm one, like a benchmark.
    model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
    handle = instrumented(model, model_name="m")
    slow = SlowForward(model)
    try:
        start = time.perf_counter()
        model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )
        wall = time.perf_counter() - start
    finally:
        slow.handle.remove()
    assert handle.flush()
    return wall


def test_latencies_match_known_forward_durations(slow_request, registry) -> None:
    """Lower bounds are the known delays; upper bounds are what the wall clock leaves for each part, so a
    busy machine (slow sleeps) cannot fail the test but a latency counted twice or in the wrong place
    does."""
    wall = slow_request
    decode_steps = NEW_TOKENS - 1

    def value(name: str, **labels: str) -> float:
        return metric(registry, name, model="m", **labels)

    ttft = value("llm_time_to_first_token_seconds_sum")
    prefill = value("llm_request_prefill_seconds_sum")
    forward_prefill = value("llm_forward_seconds_sum", phase="prefill")
    assert PREFILL_DELAY <= forward_prefill <= prefill <= ttft <= wall - decode_steps * DECODE_DELAY

    itl = value("llm_inter_token_latency_seconds_sum")
    assert value("llm_inter_token_latency_seconds_count") == decode_steps
    assert decode_steps * DECODE_DELAY <= itl <= wall - PREFILL_DELAY
    assert value("llm_request_decode_seconds_sum") == pytest.approx(itl)
    assert value("llm_request_time_per_output_token_seconds_sum") == pytest.approx(itl / decode_steps)
    max_itl = value("llm_request_max_inter_token_latency_seconds_sum")
    assert max(DECODE_DELAY, itl / decode_steps) <= max_itl <= itl - (decode_steps - 1) * DECODE_DELAY
    forward_decode = value("llm_forward_seconds_sum", phase="decode")
    assert decode_steps * DECODE_DELAY <= forward_decode <= itl

    e2e = value("llm_e2e_request_latency_seconds_sum", outcome="ok")
    assert ttft + itl <= e2e <= wall


def test_what_a_client_that_left_never_got_starts_at_its_last_delivery() -> None:
    """Arrival.undelivered_from: behind the HTTP edge, after the last chunk sent (everything when none
    was); elsewhere (no response watched), after the client left."""
    watched = Arrival(1.0)
    watched.ttft_at_first_content = True
    assert watched.undelivered_from(5.0) == 1.0  # nothing sent: all it sampled is wasted
    published: list[float] = []
    watched.publish_delivery = published.append
    watched.delivered(2.0)
    watched.delivered(3.0)
    assert watched.undelivered_from(5.0) == 3.0
    assert published == [2.0, 3.0]  # to the engine process, where the request runs there
    assert Arrival(1.0).undelivered_from(5.0) == 5.0
    ends: list[tuple[float, float]] = []
    watched.claim(None, lambda at, undelivered_from: ends.append((at, undelivered_from)))
    watched.disconnect(5.0)
    assert ends == [(5.0, 3.0)]
