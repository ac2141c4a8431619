"""The recording rules: latency quantiles and means per model, and the SLO error ratios the budget-burn
alerts read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.common import names
from inferwatch.common.durations import parse_duration

from .base import SERVING_BY, bucket_bound, num, promql, ratio_of_rates, selector

GROUP_RECORDING = "inferwatch-recording"

# The SLO alerts and the histogram each one reads.
SLO_HISTOGRAMS = {
    "InferwatchTimeToFirstTokenBudgetBurn": names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    "InferwatchInterTokenLatencyBudgetBurn": names.LLM_INTER_TOKEN_LATENCY_SECONDS,
}


def quantile_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) quantiles of histogram ``metric``."""
    return f"instance_model:{metric}:quantile_rate{window}"


def mean_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) mean of histogram ``metric``."""
    return f"instance_model:{metric}:mean_rate{window}"


def slo_error_record(metric: str, window: str) -> str:
    """Name of the recorded fraction of ``metric`` observations above the SLO target, per (job, model)."""
    return f"job_model:{metric}:slo_error_ratio_rate{window}"


def recording_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recording rules: latency quantiles and means per model, and the SLO error ratios."""
    serving = config["selectors"]["serving"]
    mean_window = config["alerts"]["InferwatchLatencyFluctuation"]["mean_window"]
    mean = {
        "record": mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, mean_window),
        "expr": ratio_of_rates(
            selector(f"{names.LLM_INTER_TOKEN_LATENCY_SECONDS}_sum", serving, ()),
            selector(f"{names.LLM_INTER_TOKEN_LATENCY_SECONDS}_count", serving, ()),
            mean_window,
        ),
    }
    quantiles = _quantile_rules(serving, config["recording"])
    return [*quantiles, mean, *_slo_error_rules(serving, config["alerts"])]


def _quantile_rules(serving: str, rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    window = rec["quantile_window"]
    rules = []
    for metric in (
        names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
        names.LLM_REQUEST_QUEUE_SECONDS,
        names.LLM_INTER_TOKEN_LATENCY_SECONDS,
        names.LLM_E2E_REQUEST_LATENCY_SECONDS,
    ):
        buckets = selector(f"{metric}_bucket", serving, ())
        for quantile in rec["quantiles"]:
            rules.append(
                {
                    "record": quantile_record(metric, window),
                    "expr": promql(f"""
                        histogram_quantile({num(quantile)},
                          sum by ({SERVING_BY}, le) (rate({buckets}[{window}]))
                        )
                    """),
                    "labels": {"quantile": num(quantile)},
                }
            )
    return rules


def _slo_error_rules(serving: str, alerts: Mapping[str, Any]) -> list[dict[str, Any]]:
    rules = []
    for alert_name, metric in SLO_HISTOGRAMS.items():
        settings = alerts[alert_name]
        if not settings["enabled"]:
            continue
        good = selector(f"{metric}_bucket", serving, (f'le=~"{bucket_bound(settings["target_seconds"])}"',))
        total = selector(f"{metric}_count", serving, ())
        windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
        for slo_window in sorted(windows, key=lambda window: parse_duration(window, promql=True)):
            rules.append(
                {
                    "record": slo_error_record(metric, slo_window),
                    "expr": promql(f"""
                        1 - (
                          sum by (job, model) (rate({good}[{slo_window}]))
                          /
                          sum by (job, model) (rate({total}[{slo_window}]))
                        )
                    """),
                }
            )
    return rules
