"""Throughput and errors: tokens per second, requests by status, failed and running requests."""

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
        "Finished requests per second: ok, error (the model raised) and oom (out of device memory).",
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
    ok = summed("rate", names.LLM_REQUESTS_TOTAL, f'{SERVING}, status="ok"', "model")
    return PanelSpec(
        "Failed requests",
        f"Share of requests that ended in an error or out-of-memory; InferwatchRequestErrors fires above "
        f"{limit:.0%}.",
        "percentunit",
        above(limit),
        [Query(f"1 - {ok} / {total}", "{{model}}")],
    )


def requests_running() -> PanelSpec:
    return PanelSpec(
        "Requests running",
        "Requests inside generate (or a tracked request) now.",
        "short",
        normal(),
        [Query(f"sum by (model) ({sel(names.LLM_REQUESTS_RUNNING, SERVING)})", "{{model}}")],
    )
