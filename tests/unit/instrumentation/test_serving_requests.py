"""What a serving process needs beyond one generate call: models that can be freed, cancelled requests,
and requests timed from their arrival at the server (queue time, waiting requests)."""

from __future__ import annotations

import copy
import gc
import threading
import time
import weakref

import pytest
import torch
from transformers import StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.timing.arrival import propagate_to_threads, request_arrival
from inferwatch.instrumentation.tracking import track_request
from tests.support.generation import generate_greedy
from tests.unit.instrumentation.conftest import batch_of, metric, scrape, wait_forgotten

pytestmark = pytest.mark.matrix

LIVE_FAMILIES = ("llm_model_info", "llm_requests_running", "llm_requests_waiting", "llm_kv_cache_bytes")

#: The prompt of every request here: its ``input_ids`` and ``attention_mask``.
HELLO = batch_of("hello")


class _GenerationCancelled(Exception):
    """Stands for transformers serve's private exception: raised from the streamer when the client left."""


class CancellingStreamer(BaseStreamer):
    """Raises the cancellation exception at the ``after``-th generated token, as a disconnect does."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.puts = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts > self.after:  # the first put is the prompt
            raise _GenerationCancelled()

    def end(self) -> None:
        pass


def test_an_instrumented_model_is_freed_and_its_live_series_go_with_it(registry) -> None:
    refs = []
    for seed in range(3):
        model = build_model("tiny-llama", seed=seed)
        handle = instrument(model, model_name="m", registry=registry)
        generate_greedy(model, *HELLO, new_tokens=4, exact_length=False)
        assert handle.flush()
        assert metric(registry, "llm_requests_total", model="m", status="ok") == seed + 1
        assert 'llm_model_info{device="cpu"' in scrape(registry)
        refs.append(weakref.ref(model))
        del model, handle
        gc.collect()
        assert refs[-1]() is None, "inferwatch kept the model alive"
        wait_forgotten(registry, "m")
        text = scrape(registry)
        for family in LIVE_FAMILIES:
            assert f'{family}{{model="m"' not in text, family
    # Counters and histograms stay, and kept counting across the three models.
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 3
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 3


def test_live_series_stay_while_another_model_of_the_name_lives(registry) -> None:
    first, second = build_model("tiny-llama", seed=0), build_model("tiny-llama", seed=1)
    instrument(first, model_name="m", registry=registry)
    instrument(second, model_name="m", registry=registry)
    del first
    gc.collect()
    assert 'llm_requests_running{model="m"} 0.0' in scrape(registry)
    generate_greedy(second, *HELLO, new_tokens=4, exact_length=False)
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1


def test_a_cancelled_generate_is_cancelled_not_an_error_and_its_tokens_count(model, registry, instrumented):
    handle = instrumented(model, model_name="m")
    with pytest.raises(_GenerationCancelled):
        generate_greedy(
            model, *HELLO, new_tokens=10, exact_length=False, streamer=CancellingStreamer(after=3)
        )
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="cancelled") == 1
    assert metric(registry, "llm_requests_total", model="m", status="error") == 0
    assert metric(registry, "llm_prompt_tokens_total", model="m") == HELLO[1].sum()
    # Tokens 1..3 were streamed; the 4th was sampled before the streamer refused it.
    assert metric(registry, "llm_generation_tokens_total", model="m") in (3, 4)
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 1
    # Its E2E is by outcome: to when its client went away, not among the served requests'.
    assert metric(registry, "llm_e2e_request_latency_seconds_count", model="m", outcome="ok") == 0
    assert metric(registry, "llm_e2e_request_latency_seconds_count", model="m", outcome="cancelled") == 1


def test_keyboard_interrupt_stays_an_error(model, registry, instrumented) -> None:
    class Interrupting(CancellingStreamer):
        def put(self, value: torch.Tensor) -> None:
            raise KeyboardInterrupt

    handle = instrumented(model, model_name="m")
    with pytest.raises(KeyboardInterrupt):
        generate_greedy(model, *HELLO, new_tokens=4, exact_length=False, streamer=Interrupting(after=0))
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="error") == 1
    assert metric(registry, "llm_requests_total", model="m", status="cancelled") == 0


def test_ttft_and_e2e_start_at_the_arrival_and_the_queue_time_is_observed(model, registry, instrumented):
    handle = instrumented(model, model_name="m")
    with request_arrival(time.perf_counter() - 0.5) as arrival:
        handle.count_waiting(arrival)
        assert metric(registry, "llm_requests_waiting", model="m") == 1
        generate_greedy(model, *HELLO, new_tokens=4, exact_length=False)
        assert metric(registry, "llm_requests_waiting", model="m") == 0
        generate_greedy(
            model, *HELLO, new_tokens=4, exact_length=False
        )  # a second generate for the same server request: timed from its own entry
    assert handle.flush()
    assert metric(registry, "llm_request_queue_seconds_count", model="m") == 1
    assert metric(registry, "llm_request_queue_seconds_sum", model="m") >= 0.5
    ttft_sum = metric(registry, "llm_time_to_first_token_seconds_sum", model="m")
    e2e_sum = metric(registry, "llm_e2e_request_latency_seconds_sum", model="m", outcome="ok")
    assert 0.5 <= ttft_sum < 1.0 + 5.0  # one request from the arrival, one from its own entry
    assert e2e_sum >= 0.5


def test_an_arrival_closed_before_its_request_ran_stops_waiting(model, registry, instrumented) -> None:
    handle = instrumented(model, model_name="m")
    with request_arrival() as arrival:
        handle.count_waiting(arrival)
    assert metric(registry, "llm_requests_waiting", model="m") == 0


def test_the_arrival_follows_generate_into_a_worker_thread(model, registry, instrumented) -> None:
    """The TextIteratorStreamer pattern: the handler starts generate in a thread of its own."""
    handle = instrumented(model, model_name="m")
    propagate_to_threads()
    with request_arrival(time.perf_counter() - 0.5):
        worker = threading.Thread(
            target=generate_greedy,
            args=(model, *HELLO),
            kwargs={"new_tokens": 4, "exact_length": False},
        )
        worker.start()
        worker.join()
    assert handle.flush()
    assert metric(registry, "llm_request_queue_seconds_count", model="m") == 1
    assert metric(registry, "llm_time_to_first_token_seconds_sum", model="m") >= 0.5


def test_a_tracked_request_takes_an_explicit_arrival(registry) -> None:
    with track_request("loop", registry=registry, arrival=time.perf_counter() - 0.25) as req:
        req.token()
    assert metric(registry, "llm_time_to_first_token_seconds_sum", model="loop") >= 0.25


def test_token_marks_leave_the_callers_stopping_criteria_and_outputs_alone(model, registry, instrumented):
    criteria = StoppingCriteriaList()
    bare = generate_greedy(model, *HELLO, new_tokens=5, exact_length=False, stopping_criteria=criteria)
    handle = instrumented(model, model_name="m")
    marked = generate_greedy(model, *HELLO, new_tokens=5, exact_length=False, stopping_criteria=criteria)
    assert handle.flush()
    assert torch.equal(bare, marked)
    assert len(criteria) == 0
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 4


def test_token_marks_ride_on_generates_own_criteria_which_copy_as_a_plain_list(model, registry, instrumented):
    instrumented(model, model_name="m")
    ours, built = model._get_stopping_criteria, []

    def keeping(*args: object, **kwargs: object) -> StoppingCriteriaList:
        built.append(ours(*args, **kwargs))
        return built[-1]

    model._get_stopping_criteria = keeping
    generate_greedy(model, *HELLO, new_tokens=4, exact_length=False)
    model._get_stopping_criteria = ours
    (criteria,) = built
    assert type(criteria).__name__ == "TokenMarkingCriteria" and isinstance(criteria, StoppingCriteriaList)
    copied = copy.deepcopy(criteria)  # a copy must not drag the request (and its locks) along
    assert type(copied) is StoppingCriteriaList
    assert [type(c) for c in copied] == [type(c) for c in criteria]
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 3
