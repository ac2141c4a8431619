"""Throughput and errors: tokens per second, requests by status, failed and cancelled requests, running
and waiting requests, and speculative decoding's acceptance rate."""

from __future__ import annotations

from inferwatch.common import names
from inferwatch.common.promql import eq, regex

from ..grafana import PanelSpec, above, normal
from .queries import MODEL_LEGEND, alert_settings, per_model, per_model_rate, query


def tokens_per_second() -> PanelSpec:
    return PanelSpec(
        "Tokens per second",
        "Generated and prompt tokens per second of successful requests.",
        "suffix:tok/s",
        normal(),
        [
            query(per_model_rate(names.LLM_GENERATION_TOKENS_TOTAL), f"generated {MODEL_LEGEND}"),
            query(per_model_rate(names.LLM_PROMPT_TOKENS_TOTAL), f"prompt {MODEL_LEGEND}"),
        ],
    )


def requests_by_status() -> PanelSpec:
    return PanelSpec(
        "Requests by status",
        "Finished requests per second: ok, error (the model raised), oom (out of device memory) and "
        "cancelled (the client went away before the end: never an error).",
        "reqps",
        normal(),
        [
            query(
                per_model_rate(names.LLM_REQUESTS_TOTAL, by=("status",)),
                f"{{{{status}}}} {MODEL_LEGEND}",
            )
        ],
    )


def failed_requests() -> PanelSpec:
    limit = alert_settings("InferwatchRequestErrors")["error_ratio_above"]
    total = per_model_rate(names.LLM_REQUESTS_TOTAL)
    # As in InferwatchRequestErrors: a request the client abandoned is no failure.
    failed = per_model_rate(names.LLM_REQUESTS_TOTAL, regex("status", "error|oom"))
    cancelled = per_model_rate(names.LLM_REQUESTS_TOTAL, eq("status", "cancelled"))
    return PanelSpec(
        "Failed requests",
        f"Share of requests that ended in an error or out-of-memory; InferwatchRequestErrors fires above "
        f"{limit:.0%}. Apart from them, the share the client cancelled (went away before the end): many "
        "cancellations next to a long queue time mean clients give up waiting.",
        "percentunit",
        above(limit),
        [
            query(failed / total, f"failed {MODEL_LEGEND}"),
            query(cancelled / total, f"cancelled {MODEL_LEGEND}"),
        ],
    )


def requests_running() -> PanelSpec:
    return PanelSpec(
        "Requests running",
        "Requests inside generate (or a tracked request) now.",
        "short",
        normal(),
        [query(per_model("sum", names.LLM_REQUESTS_RUNNING), MODEL_LEGEND)],
    )


def requests_waiting() -> PanelSpec:
    limit = alert_settings("InferwatchRequestsQueueing")["requests_waiting_above"]
    return PanelSpec(
        "Requests waiting",
        "Requests that arrived at the server for the model and have not entered generate yet (queued). "
        f"InferwatchRequestsQueueing fires when more than {limit} wait on average for a while; only "
        "servers that report arrivals (inferwatch run, the ASGI/WSGI middleware) have this series.",
        "short",
        above(limit),
        [query(per_model("sum", names.LLM_REQUESTS_WAITING), MODEL_LEGEND)],
    )


#: What the acceptance-rate panel says for models that do not speculate (they have no such series).
NO_SPECULATION = "No speculative decoding"


def speculative_acceptance() -> PanelSpec:
    accepted = per_model_rate(names.LLM_SPEC_DECODE_ACCEPTED_TOKENS_TOTAL)
    drafted = per_model_rate(names.LLM_SPEC_DECODE_DRAFT_TOKENS_TOTAL)
    return PanelSpec(
        "Speculative decoding acceptance",
        "Share of draft tokens the model accepted (assisted generation with assistant_model=, prompt "
        "lookup): accepted / proposed draft tokens per second. Each verification round also yields one "
        "token of the model's own, so a low rate still makes progress, but the draft's forwards and the "
        "wider verification forward are then mostly wasted. Only models that speculate have these series.",
        "percentunit",
        normal(),
        [query(accepted / drafted, MODEL_LEGEND)],
    )
