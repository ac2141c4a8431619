"""Prefill and decode: time per request in each phase, the decode share, batch size, forward time."""

from __future__ import annotations

from ..grafana import PanelSpec, Query, normal
from .queries import SERVING, mean, summed


def prefill_vs_decode() -> PanelSpec:
    return PanelSpec(
        "Prefill and decode time per request",
        "Mean prefill time (prompt to first token) and decode time (first to last token) per request, "
        "stacked: decode usually dominates, and it is what KV caching, batching and speculative decoding "
        "shorten.",
        "s",
        normal(),
        [
            Query(mean("llm_request_prefill_seconds").expr, "prefill {{model}}"),
            Query(mean("llm_request_decode_seconds").expr, "decode {{model}}"),
        ],
    )


def decode_share() -> PanelSpec:
    prefill = summed("rate", "llm_request_prefill_seconds_sum", SERVING, "model")
    decode = summed("rate", "llm_request_decode_seconds_sum", SERVING, "model")
    return PanelSpec(
        "Decode share of request time",
        "Decode time over prefill + decode time, over the selected range's rate window.",
        "percentunit",
        normal(),
        [Query(f"{decode} / ({prefill} + {decode})", "{{model}}")],
    )


def batch_size() -> PanelSpec:
    return PanelSpec(
        "Batch size",
        "Mean number of sequences per forward pass. Latency that grows linearly with it points at "
        "memory bandwidth (the bottleneck matrix of the reference notes).",
        "short",
        normal(),
        [mean("llm_batch_size")],
    )


def forward_time_by_phase() -> PanelSpec:
    return PanelSpec(
        "Forward time by phase",
        "Mean device time of one forward pass, prefill and decode (CUDA events; host clock on CPU).",
        "s",
        normal(),
        [mean("llm_forward_seconds", by="model, phase")],
    )
