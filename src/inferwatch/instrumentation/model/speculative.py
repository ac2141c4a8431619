"""Speculative decoding in generate (assisted generation, prompt lookup): what a round proposes and keeps.

transformers' ``_assisted_decoding`` builds a candidate generator (``_get_candidate_generator``), then
runs rounds: ``get_candidates`` proposes draft tokens (a draft model's ``generate``, an n-gram lookup in
the prompt, ...), the main model verifies them in one forward, and ``update_candidate_strategy(input_ids,
scores, num_matches)`` is told how many it kept; the round then brings ``num_matches + 1`` tokens (the kept
ones and the main model's own next token), and generate calls its stopping criteria once.

* ``_get_candidate_generator`` is wrapped on the model (an instance attribute, removed with the rest). For
  a request of the model, the generator it returns gets two wrappers on the *instance* (it lives for one
  generate call): ``get_candidates`` notes the round's draft tokens, ``update_candidate_strategy`` counts
  them in ``llm_spec_decode_draft_tokens_total`` and the kept ones in
  ``llm_spec_decode_accepted_tokens_total``; the request's sampled-token mark places as many tokens as
  ``input_ids`` grew by since the last one (:meth:`Speculation.round_tokens`).
* Both numbers are differences of shapes, which the host has without reading the device: the draft's
  length is what ``get_candidates`` added to its input, and the kept tokens are what the round added to
  ``input_ids`` (transformers appends them before it calls ``update_candidate_strategy``) less the main
  model's own token. ``num_matches`` itself is not read: transformers 5.24 passes a host int, 5.17 a
  device tensor, whose reading would be a synchronization of inferwatch's.
* A draft model's ``generate`` runs while the main model's request is current in this context: it is
  part of that request, not traffic (:func:`generate_as_draft`). It opens no request of its own; its
  forwards are timed as forwards outside any request (``LooseForward``): device time, busy time and the
  forward histograms of the *draft's* series, never token steps of the main request.

Continuous batching has no speculative path in transformers 5.24 (``generate`` refuses ``assistant_model``
with it, and ``generation/continuous_batching`` drafts nothing), so nothing is counted there.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.model.wrapping import wrap_method
from inferwatch.instrumentation.timing.request import CURRENT_REQUEST

#: Set while an instrumented model's generate runs as another model's draft (see generate_as_draft).
DRAFTING: contextvars.ContextVar[bool] = contextvars.ContextVar("inferwatch_drafting", default=False)


def drafts_for_another(model: object, current: Any) -> bool:
    """Whether a generate of ``model``, entered while ``current`` (this context's request, or None) runs,
    is a draft model's: another instrumented model's generate request is running (assisted generation
    calls the assistant's generate once per round), or a draft's generate is re-entered inside itself."""
    if current is None:
        return DRAFTING.get()
    return current.owner is not None and current.owner is not model


def generate_as_draft(original: Any, args: tuple, kwargs: dict) -> Any:
    """A draft model's generate, run for the request that is current: no request of its own, and no
    request current inside it, so its forwards are timed on their own (on the draft's series) and its
    stopping criteria are left alone."""
    request_token = CURRENT_REQUEST.set(None)
    drafting_token = DRAFTING.set(True)
    try:
        return original(*args, **kwargs)
    finally:
        DRAFTING.reset(drafting_token)
        CURRENT_REQUEST.reset(request_token)


class Speculation:
    """One assisted generate call's rounds, as the main model's request sees them."""

    __slots__ = ("accepted", "draft", "errors", "kept", "proposed", "seen", "start")

    def __init__(self, model: ModelContext, prompt_length: int) -> None:
        # Bound on first use, so a model that never speculates has no such series ("no data", not 0).
        self.draft = model.metrics[cat.SPEC_DRAFT_TOKENS].labels(model.name)
        self.accepted = model.metrics[cat.SPEC_ACCEPTED_TOKENS].labels(model.name)
        self.errors = model.errors
        self.proposed = 0  # draft tokens of the round in progress
        self.start = 0  # the length of input_ids when the round began
        self.seen = prompt_length  # the length of input_ids at the last sampled-token mark
        self.kept = False  # the round in progress has kept its tokens (update_candidate_strategy ran)

    def round_tokens(self, length: int) -> int:
        """The tokens per sequence the round that just ended brought, from ``length``, the length of
        ``input_ids`` at a stopping-criteria call: what it grew by since the last mark; 0 for a call
        before the round kept its tokens (transformers 5.17 also asks the criteria whether the
        *candidates* would end the sequence: no token was sampled there)."""
        if not self.kept:
            return 0
        self.kept = False
        tokens, self.seen = length - self.seen, length
        return max(1, tokens)

    def wrap_get_candidates(self, original: Any) -> Any:
        def get_candidates(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            try:
                input_ids = args[0] if args else kwargs["input_ids"]
                self.start = input_ids.shape[-1]
                self.proposed = max(0, result[0].shape[-1] - self.start)  # shapes: host ints
            except Exception as exc:
                self.proposed = 0
                self.errors.report("speculative", exc)
            return result

        return get_candidates

    def wrap_update(self, original: Any) -> Any:
        def update_candidate_strategy(*args: Any, **kwargs: Any) -> Any:
            try:
                input_ids = args[0] if args else kwargs["input_ids"]
                kept = input_ids.shape[-1] - self.start  # the accepted drafts and the model's own token
                accepted = max(0, kept - 1)
                proposed, self.proposed = self.proposed, 0
                self.kept = True
                self.draft.inc(proposed)
                self.accepted.inc(min(accepted, proposed))
            except Exception as exc:
                self.errors.report("speculative", exc)
            return original(*args, **kwargs)

        return update_candidate_strategy


class _Unfollowed:
    """The rounds of an assisted request that could not be followed: no sampled-token marks (so no TTFT
    or ITL for it); its tokens are counted from generate's output when it ends."""

    def round_tokens(self, length: int) -> int:
        return 0


UNFOLLOWED = _Unfollowed()


def wrap_candidate_generator(model: ModelContext, original: Any) -> Any:
    """``_get_candidate_generator``, through which assisted decoding builds its candidate generator: for a
    request of ``model`` its rounds are counted (:class:`Speculation`)."""

    @functools.wraps(original)
    def get_candidate_generator(*args: Any, **kwargs: Any) -> Any:
        generator = original(*args, **kwargs)
        request = CURRENT_REQUEST.get()
        if not model.active or request is None or request.owner is not model:
            return generator
        # Until its rounds are followed, an assisted request makes no sampled-token marks: the tokens of a
        # round are unknown, and transformers may ask the criteria about candidates, which are no tokens.
        request.count_rounds(UNFOLLOWED)
        try:
            speculation = Speculation(model, request.prompt_length)
            if (
                wrap_method(generator, "get_candidates", speculation.wrap_get_candidates) is not None
                and wrap_method(generator, "update_candidate_strategy", speculation.wrap_update) is not None
            ):
                request.count_rounds(speculation)
        except Exception as exc:
            model.errors.report("speculative", exc)
        return generator

    return get_candidate_generator
