"""Throughput and errors: tokens per second, requests by status, failed and cancelled requests, running
and waiting requests, the oldest running request's age, why requests finished, and speculative decoding's
acceptance rate."""

from __future__ import annotations

from inferwatch.common import names
from inferwatch.common.promql import eq, ne, regex

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
        "Finished requests per second: ok, error (the model raised), oom (out of device memory), "
        "cancelled (the client went away before the end: never an error), rejected (a client mistake "
        "answered before any model ran, or zero tokens asked for) and server_error (a 5xx before any "
        "model ran).",
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
    # As in InferwatchRequestErrors: a request the client abandoned is no failure, a client's mistake is
    # not the service's.
    total = per_model_rate(names.LLM_REQUESTS_TOTAL, ne("status", "rejected"))
    failed = per_model_rate(names.LLM_REQUESTS_TOTAL, regex("status", "error|oom|server_error"))
    cancelled = per_model_rate(names.LLM_REQUESTS_TOTAL, eq("status", "cancelled"))
    return PanelSpec(
        "Failed requests",
        f"Share of requests (client mistakes left out) that ended in an error, out-of-memory or a server "
        f"error before any model ran; InferwatchRequestErrors fires above "
        f"{limit:.0%}. Apart from them, the share the client cancelled (went away before the end): many "
        "cancellations next to a long queue time mean clients give up waiting.",
        "percentunit",
        above(limit),
        [
            query(failed / total, f"failed {MODEL_LEGEND}"),
            query(cancelled / total, f"cancelled {MODEL_LEGEND}"),
        ],
    )


def finish_reasons() -> PanelSpec:
    return PanelSpec(
        "Why requests finished",
        "Requests a model ran, per second, by finish_reason as the OpenAI API reports it: stop (EOS or a "
        "stop string), length (max_tokens reached: a user who often sees it sized max_tokens too small), "
        "cancelled, error, oom.",
        "reqps",
        normal(),
        [
            query(
                per_model_rate(names.LLM_REQUESTS_FINISHED_TOTAL, by=("finish_reason",)),
                f"{{{{finish_reason}}}} {MODEL_LEGEND}",
            )
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


def oldest_running_request() -> PanelSpec:
    limit = alert_settings("InferwatchRequestStuck")["age_seconds_above"]
    return PanelSpec(
        "Oldest running request",
        "How long ago the oldest running request arrived (where the server reports arrivals, else since it "
        "entered generate); 0 while none runs. A steady climb is one request that does not end, e.g. a huge "
        f"max_tokens holding a sequential server. InferwatchRequestStuck fires above {limit:g} s.",
        "s",
        above(limit),
        [query(per_model("max", names.LLM_REQUEST_OLDEST_RUNNING_AGE_SECONDS), MODEL_LEGEND)],
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
