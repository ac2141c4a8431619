"""Token counts of a finished ``generate``, computed on the output's device without a host read.

Rows end at EOS or at the length limit; a finished row of a batch is filled with padding by ``generate``,
which is not generated text. The counts are stacked into one small tensor that the caller copies to the
host asynchronously (docs/timing.md, "Token counts").
"""

from __future__ import annotations

from typing import Any

import torch


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


def prompt_and_generated(
    args: tuple, kwargs: dict, output: Any, generation_config: Any, stops_early: bool
) -> torch.Tensor | None:
    """A device tensor ``[prompt tokens, generated tokens]`` of a finished generate (summed over the
    batch), or None when the output holds no sequences. ``stops_early``: the caller's own stopping
    criteria or stop strings may end a row without EOS (then trailing padding is not counted)."""
    sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        return None
    prompt = kwargs.get("input_ids", kwargs.get("inputs"))
    if prompt is None and args:
        prompt = args[0]
    has_ids = isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and not prompt.is_floating_point()
    prompt_length = prompt.shape[1] if has_ids else 0
    eos = kwargs.get("eos_token_id", getattr(generation_config, "eos_token_id", None))
    pad = kwargs.get("pad_token_id", getattr(generation_config, "pad_token_id", None))
    pad_ids = token_ids(pad)
    # Rows end at EOS or at the length limit, and EOS already bounds them. Only a stopping criterion
    # other than EOS (stop strings, a caller's own) ends a row without one and pads it; elsewhere a
    # trailing pad id is a token the model really generated and must be counted.
    trailing_pad = pad_ids[0] if pad_ids and stops_early else None
    lengths = generated_lengths(sequences[:, prompt_length:], token_ids(eos), trailing_pad)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.device == sequences.device:
        prompt_tokens = mask.sum(dtype=torch.long)
    else:
        batch = prompt.shape[0] if has_ids else sequences.shape[0]
        prompt_tokens = torch.full((), batch * prompt_length, dtype=torch.long, device=sequences.device)
    return torch.stack([prompt_tokens, lengths.sum()])
