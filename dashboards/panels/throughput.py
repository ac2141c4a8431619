"""Throughput and errors: tokens per second, requests by status, failed and cancelled requests, running
and waiting requests, the oldest running request's age."""

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
