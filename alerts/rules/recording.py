"""The recording rules: latency quantiles and means per model, and the SLO error ratios the budget-burn
alerts read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_MODEL, num, regex

from ..config import Selectors
from .base import bucket_bound, per_model_ratio

# An SLO is the service's: its error ratio is recorded per job and model, over every instance.
PER_SERVICE = ("job", "model")

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
    """Name of the recorded fraction of ``metric`` observations above the SLO target, per (job, model)
    (:data:`PER_SERVICE`)."""
    return f"job_model:{metric}:slo_error_ratio_rate{window}"


def recording_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recording rules: latency quantiles and means per model, and the SLO error ratios."""
    selectors = Selectors.of(config)
    itl = selectors.for_serving(names.LLM_INTER_TOKEN_LATENCY_SECONDS)
    mean_window = config["alerts"]["InferwatchLatencyFluctuation"]["mean_window"]
    mean = {
        "record": mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, mean_window),
        "expr": per_model_ratio(itl.suffixed("_sum"), itl.suffixed("_count"), mean_window).pretty(),
    }
    quantiles = _quantile_rules(selectors, config["recording"])
    return [*quantiles, mean, *_slo_error_rules(selectors, config["alerts"])]


def _quantile_rules(selectors: Selectors, rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    window = rec["quantile_window"]
    rules = []
    for metric in (
        names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
        names.LLM_REQUEST_QUEUE_SECONDS,
        names.LLM_INTER_TOKEN_LATENCY_SECONDS,
        names.LLM_E2E_REQUEST_LATENCY_SECONDS,
    ):
        histogram = selectors.for_serving(metric)
        for quantile in rec["quantiles"]:
            rules.append(
                {
                    "record": quantile_record(metric, window),
                    "expr": promql.histogram_quantile(quantile, histogram, PER_MODEL, window).pretty(),
                    "labels": {"quantile": num(quantile)},
                }
            )
    return rules


def _slo_error_rules(selectors: Selectors, alerts: Mapping[str, Any]) -> list[dict[str, Any]]:
    rules = []
    for alert_name, metric in SLO_HISTOGRAMS.items():
        settings = alerts[alert_name]
        if not settings["enabled"]:
            continue
        good = selectors.for_serving(
            f"{metric}_bucket", regex("le", bucket_bound(settings["target_seconds"]))
        )
        total = selectors.for_serving(f"{metric}_count")
        windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
        for slo_window in sorted(windows, key=lambda window: parse_duration(window, promql=True)):
            good_share = promql.ratio_of_rates(good, total, PER_SERVICE, slo_window)
            rules.append({"record": slo_error_record(metric, slo_window), "expr": (1 - good_share).pretty()})
    return rules
