"""Prefill and decode: time per request in each phase, time to first token split into queue and prefill,
the decode share, batch size, forward time, and the prefill and decode tokens of each step."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import PanelSpec, normal
from .queries import MODEL_LEGEND, mean, per_model_rate, query


def prefill_vs_decode() -> PanelSpec:
    return PanelSpec(
        "Prefill and decode time per request",
        "Mean prefill time (prompt to first token) and decode time (first to last token) per request, "
        "stacked: decode usually dominates, and it is what KV caching, batching and speculative decoding "
        "shorten.",
        "s",
        normal(),
        [
            mean(names.LLM_REQUEST_PREFILL_SECONDS, what="prefill"),
            mean(names.LLM_REQUEST_DECODE_SECONDS, what="decode"),
        ],
    )


def queue_vs_prefill() -> PanelSpec:
    return PanelSpec(
        "Time to first token: queue and prefill",
        "Mean queue time (arrival at the server to the first forward) and prefill time (first forward to "
        "first token) per request, stacked: together they make the time to first token. A queue share "
        "that grows with load means too little capacity (replicas, batching); a prefill share that grows "
        "means long prompts or a slow prefill.",
        "s",
        normal(),
        [
            mean(names.LLM_REQUEST_QUEUE_SECONDS, what="queue"),
            mean(names.LLM_REQUEST_PREFILL_SECONDS, what="prefill"),
        ],
    )


def decode_share() -> PanelSpec:
    prefill = per_model_rate(f"{names.LLM_REQUEST_PREFILL_SECONDS}_sum")
    decode = per_model_rate(f"{names.LLM_REQUEST_DECODE_SECONDS}_sum")
    return PanelSpec(
        "Decode share of request time",
        "Decode time over prefill + decode time, over the selected range's rate window.",
        "percentunit",
        normal(),
        [query(decode / (prefill + decode), MODEL_LEGEND)],
    )


def batch_size() -> PanelSpec:
    return PanelSpec(
        "Batch size",
        "Mean number of sequences per forward pass (continuous batching: requests scheduled in the "
        "step). Latency that grows linearly with it points at memory bandwidth (the bottleneck matrix of "
        "the reference notes).",
        "short",
        normal(),
        [mean(names.LLM_BATCH_SIZE)],
    )


def forward_time_by_phase() -> PanelSpec:
    return PanelSpec(
        "Forward time by phase",
        "Mean device time of one forward pass by phase (CUDA events; host clock on CPU): prefill, "
        "decode, and mixed, a continuous-batching step that carries prompt tokens and decode tokens "
        "together (its time grows with the prompt tokens in it: see Tokens per step by kind).",
        "s",
        normal(),
        [mean(names.LLM_FORWARD_SECONDS, ("phase",))],
    )


def step_tokens() -> PanelSpec:
    return PanelSpec(
        "Tokens per step by kind",
        "Mean tokens one forward step processed, by kind, over the steps that carry that kind: prefill "
        "(prompt tokens) and decode (one per sequence generating its next token). A continuous-batching "
        "step usually carries both: many prompt tokens in a step lengthen it for every sequence decoding "
        "in it.",
        "short",
        normal(),
        [mean(names.LLM_STEP_TOKENS, ("kind",))],
    )


def step_tokens_rate() -> PanelSpec:
    return PanelSpec(
        "Tokens processed by kind",
        "Tokens per second the forward steps processed, prefill (prompt) and decode, stacked: how the "
        "device's work splits between reading prompts and generating.",
        "suffix:tok/s",
        normal(),
        [query(per_model_rate(f"{names.LLM_STEP_TOKENS}_sum", by=("kind",)), f"{{{{kind}}}} {MODEL_LEGEND}")],
    )
