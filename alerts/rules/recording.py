"""The recording rules: latency quantiles and means per model, and the SLO error ratios the budget-burn
alerts read.

An SLO ratio over a long window (30m, 1h, 6h) is not read from the raw buckets of every instance over that
window, which costs instances x models x window: the rates of the SLO target's bucket and of every
observation (``+Inf``) are recorded once per evaluation, per job and model, over the short window
(``recording.quantile_window``), and each longer window is the ratio of their means over it: one series
per model and bound (docs/alerts.md, "Cost at fleet scale"). The quantiles read the raw buckets over the
short window, one rule per quantile: a recording of the per-instance bucket rates for them to read instead
was measured, and cost more (the same number of series to read, and more rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_MODEL, Selector, eq, num, regex

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


def slo_bucket_rate_record(metric: str, window: str) -> str:
    """Name of the recorded rates of the SLO target's bucket and of the ``+Inf`` bucket of ``metric``, per
    (job, model) and ``le`` (:data:`PER_SERVICE`): two buckets of the histogram, not all of them."""
    return f"job_model:{metric}_bucket:rate{window}"


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
    slo = _slo_error_rules(selectors, config["alerts"], config["recording"]["quantile_window"])
    return [*quantiles, mean, *slo]


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


def _slo_error_rules(
    selectors: Selectors, alerts: Mapping[str, Any], base_window: str
) -> list[dict[str, Any]]:
    """Per enabled SLO: the per-service rates of the target's and the ``+Inf`` bucket over
    ``base_window``, then the error ratio over every window its alert reads, in that order (Prometheus
    runs one group's rules in order, so a ratio reads the rates recorded at the same evaluation).

    A window equal to ``base_window`` is the ratio of the recorded rates; a longer one the ratio of their
    means over the window (the same rates of events weighted by traffic, with the window's edges weighed
    in over ``base_window``); a shorter one, which no recording covers, reads the raw series.
    """
    base = parse_duration(base_window, promql=True)
    rules = []
    for alert_name, metric in SLO_HISTOGRAMS.items():
        settings = alerts[alert_name]
        if not settings["enabled"]:
            continue
        bound = bucket_bound(settings["target_seconds"])
        recorded = slo_bucket_rate_record(metric, base_window)
        raw_buckets = selectors.for_serving(f"{metric}_bucket", regex("le", f"{bound}|\\+Inf"))
        rules.append(
            {
                "record": recorded,
                "expr": promql.sum_rate(raw_buckets, (*PER_SERVICE, "le"), base_window).pretty(),
            }
        )
        good = Selector(recorded, (regex("le", bound),))
        total = Selector(recorded, (eq("le", "+Inf"),))
        windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
        for slo_window in sorted(windows, key=lambda window: parse_duration(window, promql=True)):
            seconds = parse_duration(slo_window, promql=True)
            if seconds == base:
                good_share = promql.aggregate("sum", good, PER_SERVICE) / promql.aggregate(
                    "sum", total, PER_SERVICE
                )
            elif seconds > base:
                good_share = promql.aggregate(
                    "sum", promql.over_time("avg", good, slo_window), PER_SERVICE
                ) / promql.aggregate("sum", promql.over_time("avg", total, slo_window), PER_SERVICE)
            else:
                good_share = promql.ratio_of_rates(
                    selectors.for_serving(f"{metric}_bucket", regex("le", bound)),
                    selectors.for_serving(f"{metric}_count"),
                    PER_SERVICE,
                    slo_window,
                )
            rules.append({"record": slo_error_record(metric, slo_window), "expr": (1 - good_share).pretty()})
    return rules
