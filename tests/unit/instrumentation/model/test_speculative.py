"""Speculative decoding in generate on real tiny Llama models: assisted generation with a real draft model
and prompt lookup. One user request is one request; draft and accepted tokens are the rounds' own."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.generation.candidate_generator import (
    AssistedCandidateGenerator,
    PromptLookupCandidateGenerator,
)

from inferwatch.instrumentation.demo.models import encode_text
from inferwatch.instrumentation.model import speculative
from tests.unit.instrumentation.conftest import metric

pytestmark = pytest.mark.matrix

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def draft(llama: torch.nn.Module) -> torch.nn.Module:
    """A smaller-budget draft that shares the main model's vocabulary: the main model's weights with noise,
    so it agrees with it on some tokens and not others. A constant schedule of 4 draft tokens per round
    (transformers' default heuristic changes the draft model's config across calls, so two runs would
    not draft the same) and no confidence cut-off."""
    model = copy.deepcopy(llama)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3 * parameter.std())
    config = model.generation_config
    config.num_assistant_tokens = 4
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = None
    return model


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([encode_text("the cat sat on the mat, the cat sat on the")])
    return ids, torch.ones_like(ids)


def generate(model: torch.nn.Module, *, do_sample: bool = False, **kwargs) -> torch.Tensor:
    ids, mask = prompt()
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=do_sample,
        **kwargs,
    )


class Rounds:
    """The truth: what transformers itself passes to its candidate generator's update_candidate_strategy
    each round (scores hold the draft's tokens + 1 positions; num_matches the kept ones)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
        self.drafted: list[int] = []
        self.matches: list[int] = []
        original = cls.update_candidate_strategy

        def update(generator, input_ids, scores, num_matches):
            self.drafted.append(scores.shape[1] - 1)
            self.matches.append(int(num_matches))
            return original(generator, input_ids, scores, num_matches)

        monkeypatch.setattr(cls, "update_candidate_strategy", update)


def test_assisted_request_is_one_request_with_its_draft_and_accepted_tokens(
    llama, draft, registry, instrumented, monkeypatch
) -> None:
    reference = generate(llama, assistant_model=draft)  # neither model instrumented yet
    rounds = Rounds(monkeypatch, AssistedCandidateGenerator)
    handle = instrumented(llama, model_name="main")
    instrumented(draft, model_name="draft")

    out = generate(llama, assistant_model=draft)
    assert handle.flush()

    assert torch.equal(out, reference)
    generated = out.shape[1] - prompt()[0].shape[1]
    assert generated == NEW_TOKENS
    # The truth's rounds drafted and kept tokens (a draft that only ever agreed, or never, tests less).
    assert sum(rounds.drafted) > sum(rounds.matches) > 0
    assert sum(m + 1 for m in rounds.matches) == generated

    assert metric(registry, "llm_requests_total", model="main") == 1
    assert metric(registry, "llm_requests_total", model="draft") == 0
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="main") == 1
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="draft") == 0
    assert metric(registry, "llm_e2e_request_latency_seconds_count", model="draft", outcome="ok") == 0
    assert metric(registry, "llm_requests_running", model="main") == 0
    assert metric(registry, "llm_requests_running", model="draft") == 0
    assert metric(registry, "llm_spec_decode_draft_tokens_total", model="main") == sum(rounds.drafted)
    assert metric(registry, "llm_spec_decode_accepted_tokens_total", model="main") == sum(rounds.matches)
    # The draft speculates for nobody: it has no such series.
    assert metric(registry, "llm_spec_decode_draft_tokens_total", model="draft") is None

    # Tokens: the output's, placed per round (a round of k tokens is k inter-token latencies, the first
    # round's all arrive with the first token).
    assert metric(registry, "llm_generation_tokens_total", model="main") == generated
    assert metric(registry, "llm_request_generation_tokens_sum", model="main") == generated
    assert metric(registry, "llm_generation_tokens_total", model="draft") == 0
    first_round = rounds.matches[0] + 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="main") == generated - first_round
    assert metric(registry, "llm_request_time_per_output_token_seconds_count", model="main") == 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="draft") == 0

    # The main model's forwards: its prefill and one verification per later round; the draft's forwards
    # are device work of its own series, none of them the main request's.
    assert metric(registry, "llm_forward_seconds_count", model="main", phase="prefill") == 1
    assert (
        metric(registry, "llm_forward_seconds_count", model="main", phase="decode") == len(rounds.matches) - 1
    )
    assert metric(registry, "llm_forward_seconds_count", model="draft") >= sum(rounds.drafted) - len(
        rounds.matches
    )
    assert not metric(registry, "llm_instrumentation_errors_total")


def test_prompt_lookup_counts_draft_and_accepted_tokens(llama, registry, instrumented, monkeypatch) -> None:
    reference = generate(llama, prompt_lookup_num_tokens=3)
    rounds = Rounds(monkeypatch, PromptLookupCandidateGenerator)
    handle = instrumented(llama, model_name="main")

    out = generate(llama, prompt_lookup_num_tokens=3)
    assert handle.flush()

    assert torch.equal(out, reference)
    generated = out.shape[1] - prompt()[0].shape[1]
    assert sum(rounds.drafted) > 0
    assert sum(m + 1 for m in rounds.matches) == generated
    assert metric(registry, "llm_requests_total", model="main") == 1
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="main") == 1
    assert metric(registry, "llm_spec_decode_draft_tokens_total", model="main") == sum(rounds.drafted)
    assert metric(registry, "llm_spec_decode_accepted_tokens_total", model="main") == sum(rounds.matches)
    assert metric(registry, "llm_generation_tokens_total", model="main") == generated
    first_round = rounds.matches[0] + 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="main") == generated - first_round
    assert not metric(registry, "llm_instrumentation_errors_total")


def test_plain_generate_has_no_speculation_series(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="main")
    generate(llama)
    assert handle.flush()
    assert metric(registry, "llm_spec_decode_draft_tokens_total") is None
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="main") == NEW_TOKENS - 1


def test_a_failing_speculation_part_is_contained(llama, draft, registry, instrumented, monkeypatch) -> None:
    reference = generate(llama, assistant_model=draft)

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(speculative, "wrap_method", broken)
    handle = instrumented(llama, model_name="main")
    instrumented(draft, model_name="draft")
    out = generate(llama, assistant_model=draft)
    assert handle.flush()
    assert torch.equal(out, reference)
    assert metric(registry, "llm_instrumentation_errors_total", stage="speculative") == 1
    assert metric(registry, "llm_requests_total", model="main") == 1
    assert metric(registry, "llm_requests_total", model="draft") == 0
    assert metric(registry, "llm_generation_tokens_total", model="main") == NEW_TOKENS


def test_removed_instrumentation_leaves_no_wrapper(llama, instrumented) -> None:
    handle = instrumented(llama, model_name="main")
    assert "_get_candidate_generator" in vars(llama)
    handle.remove()
    assert "_get_candidate_generator" not in vars(llama)


def test_speculative_sampling_counts_what_transformers_kept(
    llama, draft, registry, instrumented, monkeypatch
) -> None:
    # do_sample=True with the draft's logits: speculative sampling (_speculative_sampling), same seed.
    torch.manual_seed(7)
    reference = generate(llama, assistant_model=draft, do_sample=True)
    rounds = Rounds(monkeypatch, AssistedCandidateGenerator)
    handle = instrumented(llama, model_name="main")
    instrumented(draft, model_name="draft")
    torch.manual_seed(7)
    out = generate(llama, assistant_model=draft, do_sample=True)
    assert handle.flush()
    assert torch.equal(out, reference)  # inferwatch draws no random numbers
    assert metric(registry, "llm_requests_total", model="main") == 1
    assert metric(registry, "llm_requests_total", model="draft") == 0
    assert metric(registry, "llm_spec_decode_draft_tokens_total", model="main") == sum(rounds.drafted)
    assert metric(registry, "llm_spec_decode_accepted_tokens_total", model="main") == sum(rounds.matches)
    assert metric(registry, "llm_generation_tokens_total", model="main") == NEW_TOKENS
    assert not metric(registry, "llm_instrumentation_errors_total")
