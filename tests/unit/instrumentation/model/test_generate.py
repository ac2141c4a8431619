"""generate() on real tiny GPT-2 and Llama models: the metrics count exactly what was generated."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from inferwatch.instrumentation.demo.models import EOS_TOKEN_ID, PAD_TOKEN_ID
from tests.unit.instrumentation.conftest import batch_of, metric

pytestmark = pytest.mark.matrix


class EosSchedule(LogitsProcessor):
    """Row ``r`` emits EOS exactly at its ``schedule[r]``-th new token and never before; rows without an
    entry never emit it. The model's own stopping logic then ends rows early, as a real EOS would."""

    def __init__(self, prompt_length: int, schedule: dict[int, int]) -> None:
        self.prompt_length = prompt_length
        self.schedule = schedule

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_length + 1
        scores[:, EOS_TOKEN_ID] = float("-inf")
        for row, at in self.schedule.items():
            if step == at:
                scores[row] = float("-inf")
                scores[row, EOS_TOKEN_ID] = 0.0
        return scores


class CountingStreamer(BaseStreamer):
    """Counts what generate streams: the prompt first, then one tensor per step."""

    def __init__(self) -> None:
        self.puts: list[torch.Tensor] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value)

    def end(self) -> None:
        self.ended = True


def test_greedy_batch_counts_tokens_requests_and_histograms(model, registry, instrumented) -> None:
    handle = instrumented(model, model_name="m")
    ids, mask = batch_of("hello", "a longer prompt")  # 1 + 5 and 1 + 15 tokens, left-padded
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert handle.flush()
    assert out.shape[1] - ids.shape[1] == 6

    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1
    assert metric(registry, "llm_requests_total", model="m", status="error") == 0
    assert metric(registry, "llm_prompt_tokens_total", model="m") == 6 + 16  # padding excluded
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * 6
    assert metric(registry, "llm_request_prompt_tokens_sum", model="m") == 22
    assert metric(registry, "llm_request_generation_tokens_sum", model="m") == 12
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 1
    assert (
        metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 5
    )  # per step after the first
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="prefill") == 1
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == 5
    assert metric(registry, "llm_batch_size_count", model="m") == 6
    assert metric(registry, "llm_batch_size_sum", model="m") == 12
    assert metric(registry, "llm_e2e_request_latency_seconds_count", model="m", outcome="ok") == 1
    for name in (
        "llm_request_prefill_seconds",
        "llm_request_decode_seconds",
        "llm_request_time_per_output_token_seconds",
        "llm_request_max_inter_token_latency_seconds",
    ):
        assert metric(registry, name + "_count", model="m") == 1, name
    assert metric(registry, "llm_requests_running", model="m") == 0
    assert metric(registry, "llm_kv_cache_bytes", model="m") == 0  # the request's cache is gone
    assert metric(registry, "llm_instrumentation_errors_total") is None


@pytest.mark.parametrize("pad_token_id", [PAD_TOKEN_ID, EOS_TOKEN_ID], ids=["pad", "pad-is-eos"])
def test_early_eos_in_a_batch_counts_tokens_up_to_eos(llama, registry, instrumented, pad_token_id) -> None:
    handle = instrumented(llama, model_name="m")
    ids, mask = batch_of("one", "two", "three")
    schedule = EosSchedule(ids.shape[1], {0: 2, 1: 5})  # row 2 runs to max_new_tokens
    out = llama.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=7,
        do_sample=False,
        logits_processor=LogitsProcessorList([schedule]),
        pad_token_id=pad_token_id,
    )
    assert handle.flush()
    new = out[:, ids.shape[1] :]
    assert new.shape[1] == 7
    assert new[0, 1] == EOS_TOKEN_ID and (new[0, 2:] == pad_token_id).all()  # row 0 finished: padding
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 + 5 + 7
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 6


class ForceToken(LogitsProcessor):
    """Every new token is ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[:] = float("-inf")
        scores[:, self.token] = 0.0
        return scores


def test_a_generated_pad_token_is_counted(llama, registry, instrumented) -> None:
    """The pad id is an ordinary token to a model with random (or unlucky) weights: rows that end at the
    length limit keep every token they generated, whatever its id."""
    handle = instrumented(llama, model_name="m")
    ids, mask = batch_of("one", "two")
    out = llama.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=4,
        do_sample=False,
        logits_processor=LogitsProcessorList([ForceToken(PAD_TOKEN_ID)]),
        pad_token_id=PAD_TOKEN_ID,
    )
    assert handle.flush()
    assert (out[:, ids.shape[1] :] == PAD_TOKEN_ID).all()
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * 4


def test_all_rows_stopping_early_stop_the_request(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m")
    ids, mask = batch_of("one", "two", "three")
    schedule = EosSchedule(ids.shape[1], {0: 2, 1: 4, 2: 3})
    out = llama.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        logits_processor=LogitsProcessorList([schedule]),
    )
    assert handle.flush()
    assert out.shape[1] - ids.shape[1] == 4
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 + 4 + 3
    assert metric(registry, "llm_forward_seconds_count", model="m") == 4


def test_sampling_counts_and_is_bit_identical(model, registry, instrumented) -> None:
    ids, mask = batch_of("sampling", "is random")
    kwargs = dict(attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=True, top_k=20)
    torch.manual_seed(7)
    plain = model.generate(ids, **kwargs)
    handle = instrumented(model, model_name="m")
    torch.manual_seed(7)
    watched = model.generate(ids, **kwargs)
    assert handle.flush()
    assert torch.equal(plain, watched)
    assert metric(registry, "llm_generation_tokens_total", model="m") == 10


def test_greedy_outputs_are_bit_identical_with_and_without(model, instrumented) -> None:
    ids, mask = batch_of("the same", "output")
    kwargs = dict(
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    plain = model.generate(ids, **kwargs)
    instrumented(model)
    watched = model.generate(ids, **kwargs)
    assert type(plain) is type(watched)
    assert torch.equal(plain.sequences, watched.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, watched.scores, strict=True))


def test_streamer_and_dict_outputs(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m")
    ids, mask = batch_of("stream me")
    streamer = CountingStreamer()
    out = llama.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=9,
        do_sample=False,
        streamer=streamer,
        logits_processor=LogitsProcessorList([EosSchedule(ids.shape[1], {0: 4})]),
        return_dict_in_generate=True,
    )
    assert handle.flush()
    streamed = len(streamer.puts) - 1  # the first put is the prompt
    assert streamer.ended and streamed == 4 == out.sequences.shape[1] - ids.shape[1]
    assert metric(registry, "llm_generation_tokens_total", model="m") == streamed
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == streamed - 1


def test_max_new_tokens_over_several_requests(gpt2, registry, instrumented) -> None:
    handle = instrumented(gpt2, model_name="m")
    for new_tokens in (1, 3, 8):
        ids, mask = batch_of("limits")
        gpt2.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 3
    assert metric(registry, "llm_generation_tokens_total", model="m") == 1 + 3 + 8
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 3
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == 0 + 2 + 7
    # A one-token request has no decode phase: no TPOT, and a decode time of 0.
    assert metric(registry, "llm_request_time_per_output_token_seconds_count", model="m") == 2
    assert metric(registry, "llm_request_decode_seconds_count", model="m") == 3


def test_model_info_and_default_model_name(llama, registry, instrumented) -> None:
    instrumented(llama)  # built from a config: no _name_or_path, so the model_type names it
    params = sum(p.numel() for p in llama.parameters())
    assert (
        metric(
            registry,
            "llm_model_info",
            model="llama",
            model_type="llama",
            dtype="float32",
            device="cpu",
            params=str(params),
        )
        == 1
    )


def test_two_models_share_the_families_of_one_registry(llama, gpt2, registry, instrumented) -> None:
    first, second = instrumented(llama, model_name="a"), instrumented(gpt2, model_name="b")
    for model in (llama, gpt2):
        ids, mask = batch_of("shared")
        model.generate(ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert first.flush() and second.flush()
    assert metric(registry, "llm_generation_tokens_total", model="a") == 2
    assert metric(registry, "llm_generation_tokens_total", model="b") == 2
