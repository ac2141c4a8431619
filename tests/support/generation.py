"""One ``generate`` call as the tests make it: greedy, a fixed number of new tokens, no gradients."""

from __future__ import annotations

from typing import Any

import torch


def generate_greedy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    new_tokens: int,
    exact_length: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """``model.generate`` of ``input_ids``, greedy (``do_sample=False``) and under ``torch.no_grad()`` as a
    server runs it; returns its output (the prompt's ids, then the generated ones).

    ``attention_mask`` defaults to all ones: rows without padding. At most ``new_tokens`` are generated per
    row; with ``exact_length`` (the default) also at least as many (``min_new_tokens``), so no EOS ends a
    row early and the number of steps is known. ``kwargs`` go to ``generate`` unchanged (``streamer``,
    ``stopping_criteria``, ``cache_implementation``...).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if exact_length:
        kwargs["min_new_tokens"] = new_tokens
    with torch.no_grad():
        return model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, do_sample=False, **kwargs
        )
