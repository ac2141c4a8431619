"""The token counters move while tokens are produced, never count a token that was not, and end exact.

Every path that makes tokens is read back *during* its run: generate (greedy, batched with rows ending at
different steps), generate's compiled decode steps, continuous batching and a tracked request. The truth
at each moment is what the model has produced so far, which the test knows from the tokens it is handed
(a streamer's puts, the manager's outputs, its own ``req.token()`` calls). Resolution runs in batches of
steps (``request.DRAIN_BATCH``, ``RUN_DRAIN_MARKS``): a counter may trail by one batch, no more.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from inferwatch.instrumentation import instrument, track_request
from inferwatch.instrumentation.demo.models import EOS_TOKEN_ID, build_model, encode_text
from inferwatch.instrumentation.timing import request
from tests.support.batching import small_page_pool
from tests.unit.instrumentation.conftest import batch_of
from tests.unit.instrumentation.model.test_compiled import compiled_generation_config
from tests.unit.instrumentation.model.test_generate import EosSchedule

pytestmark = pytest.mark.matrix

#: Decode steps one resolution batch of generate holds: a forward and a sampled-token mark per step.
GENERATE_LAG = request.DRAIN_BATCH // 2 + 1
#: Decode steps one resolution batch of a compiled run holds: two marks per step.
RUN_LAG = request.RUN_DRAIN_MARKS // 2 + GENERATE_LAG


def counters(registry: CollectorRegistry, model: str = "m") -> tuple[float, float]:
    """(prompt tokens, generated tokens) counted so far."""
    labels = {"model": model}
    prompt = registry.get_sample_value("llm_prompt_tokens_total", labels) or 0.0
    generated = registry.get_sample_value("llm_generation_tokens_total", labels) or 0.0
    return prompt, generated


class Reader(BaseStreamer):
    """At every step generate streams, the tokens produced so far (per row) and the counters then."""

    def __init__(self, registry: CollectorRegistry, rows_alive: list[int] | None = None) -> None:
        self.registry = registry
        self.rows_alive = rows_alive  # rows still generating at each step; all of them when None
        self.steps = -1  # the first put is the prompt
        self.produced = 0
        self.readings: list[tuple[int, float, float]] = []  # (tokens produced, prompt, generated)

    def put(self, value: torch.Tensor) -> None:
        self.steps += 1
        if self.steps == 0:
            return
        rows = value.shape[0] if self.rows_alive is None else self.rows_alive[self.steps - 1]
        self.produced += rows
        self.readings.append((self.produced, *counters(self.registry)))

    def end(self) -> None:
        pass


def assert_live(
    readings: list[tuple[int, float, float]], prompt: int, rows: int, lag_steps: int, ahead: bool = False
) -> None:
    """Never above the truth (unless the reader is ``ahead``-allowed: it sees the tokens later than they
    are made); never behind it by more than one resolution batch; the prompt counted once the first
    batch resolved."""
    for produced, counted_prompt, generated in readings:
        assert ahead or generated <= produced, readings
        assert generated >= produced - rows * lag_steps, readings
        assert counted_prompt in (0, prompt), readings
    assert any(counted_prompt == prompt for _, counted_prompt, _ in readings[: lag_steps + 1]), readings


def test_generate_counts_tokens_as_they_are_produced(llama) -> None:
    registry = CollectorRegistry()
    handle = instrument(llama, model_name="m", registry=registry)
    try:
        ids, mask = batch_of("count me while I run")
        reader = Reader(registry)
        llama.generate(
            ids, attention_mask=mask, max_new_tokens=120, min_new_tokens=120, do_sample=False, streamer=reader
        )
        assert handle.flush()
    finally:
        handle.remove()
    assert_live(reader.readings, int(mask.sum()), rows=1, lag_steps=GENERATE_LAG)
    assert 0 < reader.readings[60][2] < 120  # mid-request, the counter has moved
    assert counters(registry) == (int(mask.sum()), 120)


def test_a_batch_whose_rows_end_early_counts_a_lower_bound_then_exactly(llama) -> None:
    # Row 0 ends with EOS at its 5th token, row 1 runs to 80: the padding generate appends to row 0 is not
    # generated text, and no live count may claim it.
    registry = CollectorRegistry()
    handle = instrument(llama, model_name="m", registry=registry)
    try:
        ids, mask = batch_of("short one", "a longer prompt")
        schedule = EosSchedule(ids.shape[1], {0: 5, 1: 80})
        alive = [2 if step <= 5 else 1 for step in range(1, 81)]
        reader = Reader(registry, rows_alive=alive)
        llama.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=200,
            do_sample=False,
            eos_token_id=EOS_TOKEN_ID,
            logits_processor=LogitsProcessorList([schedule]),
            streamer=reader,
        )
        assert handle.flush()
    finally:
        handle.remove()
    assert_live(reader.readings, int(mask.sum()), rows=2, lag_steps=GENERATE_LAG)
    assert counters(registry) == (int(mask.sum()), 5 + 80)


def test_compiled_decode_steps_count_tokens_as_they_are_produced() -> None:
    torch._dynamo.reset()
    model = build_model("tiny-llama")
    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    try:
        ids = torch.tensor([encode_text("static and compiled"), encode_text("a second row here!!")])
        reader = Reader(registry)
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=compiled_generation_config(300),
                streamer=reader,
            )
        assert handle.flush()
    finally:
        handle.remove()
        torch._dynamo.reset()
    assert_live(reader.readings, ids.numel(), rows=2, lag_steps=RUN_LAG)
    assert 0 < reader.readings[200][2] < 2 * 300
    assert counters(registry) == (ids.numel(), 2 * 300)


def test_continuous_batching_counts_tokens_as_they_are_produced(llama) -> None:
    registry = CollectorRegistry()
    handle = instrument(llama, model_name="m", registry=registry)
    prompt = encode_text("a long story in steps")
    manager = llama.init_continuous_batching(
        generation_config=GenerationConfig(max_new_tokens=300, do_sample=False, eos_token_id=-1),
        continuous_batching_config=small_page_pool(),
    )
    manager.start()
    readings: list[tuple[int, float, float]] = []
    try:
        request_id = manager.add_request(prompt, max_new_tokens=300, streaming=True)
        for output in manager.request_id_iter(request_id):
            # What the user has been handed so far, then what the counters say.
            readings.append((len(output.generated_tokens), *counters(registry)))
            if output.is_finished():
                break
    finally:
        manager.stop(block=True)
    assert handle.flush()
    handle.remove()
    # Each step is resolved when it is delivered or the next one is prepared: the counters trail the
    # manager by a step or two. The outputs reach this thread through a queue, behind the manager: what it
    # was handed is no upper bound (each token counted is one the manager made: exact at the end).
    assert_live(readings[:-1], len(prompt), rows=1, lag_steps=3, ahead=True)
    assert 0 < readings[150][2] < 300
    assert counters(registry) == (len(prompt), 300)


def test_a_tracked_request_counts_tokens_as_they_are_produced() -> None:
    registry = CollectorRegistry()
    readings: list[tuple[int, float, float]] = []
    with track_request("m", prompt_tokens=7, registry=registry) as req:
        for produced in range(1, 101):
            req.token()
            readings.append((produced, *counters(registry)))
    assert_live(readings, 7, rows=1, lag_steps=request.DRAIN_BATCH)
    assert 0 < readings[50][2] < 100
    assert counters(registry) == (7, 100)


@pytest.mark.timing  # a rate over a second of wall time: in the timing tier, not the unit tier's
def test_a_scrape_during_generation_reads_a_rate(llama) -> None:
    # What a tokens/s panel sees: two reads of the counter a second apart while one request runs are a
    # rate near the model's, not 0 followed by a spike at the request's end.
    registry = CollectorRegistry()
    handle = instrument(llama, model_name="m", registry=registry)
    produced: list[tuple[float, int]] = []

    class Clocked(BaseStreamer):
        def put(self, value: torch.Tensor) -> None:
            produced.append((time.perf_counter(), len(produced)))

        def end(self) -> None:
            pass

    ids, mask = batch_of("rate")
    worker = threading.Thread(
        target=llama.generate,
        args=(ids,),
        kwargs=dict(
            attention_mask=mask, max_new_tokens=3000, min_new_tokens=3000, do_sample=False, streamer=Clocked()
        ),
    )
    try:
        worker.start()
        while len(produced) < 200:
            time.sleep(0.01)
        start, first = time.perf_counter(), counters(registry)[1]
        time.sleep(1.0)
        end, last = time.perf_counter(), counters(registry)[1]
        truth = [count for at, count in produced if start <= at <= end]
        worker.join()
    finally:
        handle.remove()
    rate, true_rate = (last - first) / (end - start), (truth[-1] - truth[0]) / (end - start)
    assert abs(rate - true_rate) <= 0.1 * true_rate, (rate, true_rate)
