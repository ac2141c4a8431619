"""Token counts of a finished ``generate``, computed on the output's device without a host read.

Rows end at EOS or at the length limit; a finished row of a batch is filled with padding by ``generate``,
which is not generated text. The prompt is counted from generate's arguments at its entry, the generated
tokens from its output; a count that needs the device is a small tensor the caller copies to the host
asynchronously (docs/timing.md, "Token counts").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from inferwatch.instrumentation.timing.clock import Clock, Fetched, Known


def generated_lengths(generated: torch.Tensor, eos_ids: list[int], pad_id: int | None) -> torch.Tensor:
    """Tokens each row really generated: up to and including its first EOS, without trailing padding.

    Runs on the tensor's device (a few small kernels, no host read)."""
    batch, length = generated.shape
    lengths = torch.full((batch,), length, dtype=torch.long, device=generated.device)
    if length == 0:
        return lengths
    if eos_ids:
        is_eos = generated == eos_ids[0]
        for eos in eos_ids[1:]:
            is_eos |= generated == eos
        before_eos = (is_eos.cumsum(dim=1) == 0).sum(dim=1)
        lengths = before_eos + is_eos.any(dim=1)
    if pad_id is not None and pad_id not in eos_ids:
        trailing_pad = ((generated != pad_id).flip(1).cumsum(dim=1) == 0).sum(dim=1)
        lengths = torch.minimum(lengths, length - trailing_pad)
    return lengths


def stops_without_eos(kwargs: dict) -> bool:
    """Whether this generate call can end a row other than by EOS or the length limit."""
    return bool(kwargs.get("stop_strings") or kwargs.get("stopping_criteria"))


def token_ids(value: Any) -> list[int]:
    """Token ids given as an int, a list or a CPU tensor (a device tensor would need a host read)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()] if value.device.type == "cpu" else []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class Prompt(NamedTuple):
    """A generate call's prompt, as its arguments say before any device work."""

    #: Sequences of the caller's batch.
    rows: int
    #: Tokens per row that generate's output holds before the generated ones (0 for ``inputs_embeds``).
    length: int
    #: Prompt tokens, padding excluded: an int, or a 0-dim tensor on the attention mask's device when the
    #: mask is not on the host (its sum would need a host read).
    tokens: torch.Tensor | int

    def count(self, clock: Clock) -> Fetched:
        """The prompt tokens on their way to the host: copied once the device gets there."""
        tokens = self.tokens
        if not isinstance(tokens, torch.Tensor):
            return Known([tokens])
        if tokens.device == clock.device:
            return clock.fetch(tokens.reshape(1))
        # A mask on another device than the model's could only be read by waiting for it: padding counts.
        return Known([self.rows * self.length])


def prompt_of(args: tuple, kwargs: dict) -> Prompt | None:
    """The prompt of a generate call from its ``input_ids`` (or ``inputs``, or positional) and
    ``attention_mask``; None when it has neither ids nor embeddings."""
    ids = kwargs.get("input_ids", kwargs.get("inputs"))
    if ids is None and args:
        ids = args[0]
    has_ids = isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
    embeds = kwargs.get("inputs_embeds")
    if has_ids:
        rows, length = ids.shape[0], ids.shape[1]
    elif isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        rows, length = embeds.shape[0], 0
    else:
        return None
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor):
        return Prompt(rows, length, rows * length)
    tokens = mask.sum(dtype=torch.long)
    return Prompt(rows, length, int(tokens) if mask.device.type == "cpu" else tokens)


def every_row_generates(kwargs: dict, generation_config: Any) -> float:
    """How many token steps of a generate call every row of its batch surely takes part in: all of them
    when only the length limit ends a row, the first ``min_new_tokens`` when EOS can (transformers masks
    EOS out until then), none when stop strings or a caller's criteria can. Counting tokens live, a later
    step counts one token (some row is still generating, or generate would have stopped)."""
    if stops_without_eos(kwargs) or getattr(generation_config, "stop_strings", None):
        return 0
    eos = kwargs.get("eos_token_id", getattr(generation_config, "eos_token_id", None))
    if eos is None or (not isinstance(eos, torch.Tensor) and not token_ids(eos)):
        return math.inf
    return kwargs.get("min_new_tokens", getattr(generation_config, "min_new_tokens", None)) or 0


def new_token_limit(kwargs: dict, generation_config: Any, prompt_length: int) -> int | None:
    """The new tokens a row of this generate call may generate, as transformers decides it:
    ``max_new_tokens`` (the argument's, else the generation config's), else ``max_length`` less the
    prompt; None when neither is known."""
    limit = kwargs.get("max_new_tokens", getattr(generation_config, "max_new_tokens", None))
    if limit is not None:
        return int(limit)
    max_length = kwargs.get("max_length", getattr(generation_config, "max_length", None))
    return None if max_length is None else int(max_length) - prompt_length


def generated_count(
    output: Any, prompt_length: int, generation_config: Any, kwargs: dict
) -> torch.Tensor | None:
    """A 2-element device tensor: tokens a finished generate produced, summed over its rows, and those
    of its longest row (each up to and including its EOS, its padding after excluded); None when the
    output holds no sequences."""
    sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        return None
    eos = kwargs.get("eos_token_id", getattr(generation_config, "eos_token_id", None))
    pad = kwargs.get("pad_token_id", getattr(generation_config, "pad_token_id", None))
    pad_ids = token_ids(pad)
    # Rows end at EOS or at the length limit, and EOS already bounds them. Only a stopping criterion
    # other than EOS (stop strings, a caller's own) ends a row without one and pads it; elsewhere a
    # trailing pad id is a token the model really generated and must be counted.
    trailing_pad = pad_ids[0] if pad_ids and stops_without_eos(kwargs) else None
    lengths = generated_lengths(sequences[:, prompt_length:], token_ids(eos), trailing_pad)
    return torch.stack((lengths.sum(), lengths.max()))


class LiveTokens:
    """One request's tokens as the counters have them while it runs (docs/timing.md, "Token counts"): its
    prompt once its prefill has run, its generated tokens as they are placed, ``rows`` per token step for
    the first ``every_row_steps`` steps and one after (a row that ended is padded, and only the output
    says which), topped up to the exact figures when it ends."""

    __slots__ = ("_every_row_steps", "_prompt", "_prompt_counted", "_prompt_tokens", "generated", "rows")

    def __init__(self, prompt: Fetched | None, rows: int, every_row_steps: float) -> None:
        self._prompt = prompt  # on its way to the host
        self._prompt_tokens: int | None = None
        self._prompt_counted = False
        self.rows = rows
        self._every_row_steps = every_row_steps
        self.generated = 0  # counted so far

    def prompt_ready(self) -> bool:
        return self._prompt is None or self._prompt.ready()

    def _prompt_value(self) -> int | None:
        """The prompt's token count once it is on the host (read from the device copy once)."""
        prompt = self._prompt
        if prompt is not None and prompt.ready():
            self._prompt, self._prompt_tokens = None, int(prompt.value()[0])
        return self._prompt_tokens

    def count_prompt(self, counter: Any, observations: Any) -> None:
        """The prefill has run: its prompt tokens go to ``counter`` (once)."""
        if not self._prompt_counted and (tokens := self._prompt_value()) is not None:
            self._prompt_counted = True
            observations.count(counter, tokens)

    def count_steps(self, done: int, steps: int, counter: Any, observations: Any) -> None:
        """``steps`` token steps after the first ``done`` were placed: their tokens go to ``counter``."""
        every_row = max(0, min(done + steps, self._every_row_steps) - done)
        tokens = int(every_row * self.rows + steps - every_row)
        self.generated += tokens
        observations.count(counter, tokens)

    def settle(self, series: Any, generated: int, observations: Any) -> None:
        """The request ended having generated ``generated`` tokens: the series get the exact figures."""
        prompt = self._prompt_value() or 0
        counted_prompt = prompt if self._prompt_counted else 0
        series.settle_request_tokens(prompt, generated, counted_prompt, self.generated, observations)
