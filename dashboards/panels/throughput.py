"""Throughput and errors: tokens per second, requests by status, failed and cancelled requests, running
and waiting requests."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import PanelSpec, Query, above, normal
from .queries import SERVING, alert_settings, sel, summed


def tokens_per_second() -> PanelSpec:
    return PanelSpec(
        "Tokens per second",
        "Generated and prompt tokens per second of successful requests.",
        "suffix:tok/s",
        normal(),
        [
            Query(
                summed("rate", names.LLM_GENERATION_TOKENS_TOTAL, SERVING, "model"),
                "generated {{model}}",
            ),
            Query(
                summed("rate", names.LLM_PROMPT_TOKENS_TOTAL, SERVING, "model"),
                "prompt {{model}}",
            ),
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
            Query(
                summed("rate", names.LLM_REQUESTS_TOTAL, SERVING, "model, status"),
                "{{status}} {{model}}",
            )
        ],
    )


def failed_requests() -> PanelSpec:
    limit = alert_settings("InferwatchRequestErrors")["error_ratio_above"]
    total = summed("rate", names.LLM_REQUESTS_TOTAL, SERVING, "model")
    # As in InferwatchRequestErrors: a request the client abandoned is no failure.
    failed = summed("rate", names.LLM_REQUESTS_TOTAL, f'{SERVING}, status=~"error|oom"', "model")
    cancelled = summed("rate", names.LLM_REQUESTS_TOTAL, f'{SERVING}, status="cancelled"', "model")
    return PanelSpec(
        "Failed requests",
        f"Share of requests that ended in an error or out-of-memory; InferwatchRequestErrors fires above "
        f"{limit:.0%}. Apart from them, the share the client cancelled (went away before the end): many "
        "cancellations next to a long queue time mean clients give up waiting.",
        "percentunit",
        above(limit),
        [
            Query(f"{failed} / {total}", "failed {{model}}"),
            Query(f"{cancelled} / {total}", "cancelled {{model}}"),
        ],
    )


def requests_running() -> PanelSpec:
    return PanelSpec(
        "Requests running",
        "Requests inside generate (or a tracked request) now.",
        "short",
        normal(),
        [Query(f"sum by (model) ({sel(names.LLM_REQUESTS_RUNNING, SERVING)})", "{{model}}")],
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
        [Query(f"sum by (model) ({sel(names.LLM_REQUESTS_WAITING, SERVING)})", "{{model}}")],
    )
