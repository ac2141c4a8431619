"""The recording rules: histogram bucket rates read once, and from them the latency quantiles per model,
the SLO error ratios the budget-burn alerts read, and the mean inter-token latency.

The chain costs by what is asked, not by buckets times instances and windows. Raw bucket series are read
once per evaluation, over one short window (``recording.quantile_window``), into
``instance_model:<histogram>_bucket:rate<window>`` (per job, instance, model and ``le``: what one
serving process exposes, summed, so nothing is lost); every quantile, the queue-time alert and the
per-service bucket rates ``job_model:<histogram>_bucket:rate<window>`` read that recording instead of
the raw buckets. An SLO ratio over a longer window (30m, 1h, 6h) is the mean of the recorded short-window
rates of the target bucket and of all observations over that window, per job and model: it reads one
series per model and bucket bound, not every instance's raw samples of the whole window
(docs/alerts.md, "Cost at fleet scale").
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

# The histograms whose quantiles are recorded, and whose bucket rates are therefore recorded per instance.
QUANTILE_HISTOGRAMS = (
    names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    names.LLM_REQUEST_QUEUE_SECONDS,
    names.LLM_INTER_TOKEN_LATENCY_SECONDS,
    names.LLM_E2E_REQUEST_LATENCY_SECONDS,
)

# Every observation of a histogram: its +Inf bucket (which the exposition format requires, equal to
# _count), so the recorded bucket rates give totals without reading _count again.
ALL_OBSERVATIONS = eq("le", "+Inf")


def quantile_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) quantiles of histogram ``metric``."""
    return f"instance_model:{metric}:quantile_rate{window}"


def mean_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) mean of histogram ``metric``."""
    return f"instance_model:{metric}:mean_rate{window}"


def bucket_rate_record(metric: str, window: str, by: tuple[str, ...] = PER_MODEL) -> str:
    """Name of the recorded bucket rates of histogram ``metric`` over ``window``, summed by ``by`` and
    ``le``: per job, instance and model (:data:`PER_MODEL`), or per job and model (:data:`PER_SERVICE`)."""
    level = {PER_MODEL: "instance_model", PER_SERVICE: "job_model"}[by]
    return f"{level}:{metric}_bucket:rate{window}"


def slo_error_record(metric: str, window: str) -> str:
    """Name of the recorded fraction of ``metric`` observations above the SLO target, per (job, model)
    (:data:`PER_SERVICE`)."""
    return f"job_model:{metric}:slo_error_ratio_rate{window}"


def recorded_bucket_rates(metric: str, window: str, *matchers: promql.Matcher) -> Selector:
    """The recorded per-(job, instance, model) bucket rates of ``metric`` over ``window``."""
    return Selector(bucket_rate_record(metric, window), matchers)


def recording_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recording rules, in the order they must run (a rule reads those above it, at the same
    evaluation in Prometheus, which runs one group's rules in order)."""
    selectors = Selectors.of(config)
    itl = selectors.for_serving(names.LLM_INTER_TOKEN_LATENCY_SECONDS)
    mean_window = config["alerts"]["InferwatchLatencyFluctuation"]["mean_window"]
    mean = {
        "record": mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, mean_window),
        "expr": per_model_ratio(itl.suffixed("_sum"), itl.suffixed("_count"), mean_window).pretty(),
    }
    window = config["recording"]["quantile_window"]
    bucket_rates = [
        {
            "record": bucket_rate_record(metric, window),
            "expr": promql.sum_rate(
                selectors.for_serving(f"{metric}_bucket"), (*PER_MODEL, "le"), window
            ).pretty(),
        }
        for metric in QUANTILE_HISTOGRAMS
    ]
    return [
        *bucket_rates,
        *_quantile_rules(config["recording"]),
        mean,
        *_slo_error_rules(selectors, config["alerts"], window),
    ]


def _quantile_rules(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    window = rec["quantile_window"]
    return [
        {
            "record": quantile_record(metric, window),
            "expr": promql.Call(
                "histogram_quantile", (promql.Number(quantile), recorded_bucket_rates(metric, window))
            ).pretty(),
            "labels": {"quantile": num(quantile)},
        }
        for metric in QUANTILE_HISTOGRAMS
        for quantile in rec["quantiles"]
    ]


def _slo_error_rules(
    selectors: Selectors, alerts: Mapping[str, Any], base_window: str
) -> list[dict[str, Any]]:
    """Per enabled SLO: the per-service bucket rates over ``base_window`` (from the per-instance
    recording), then the error ratio over every window its alert reads.

    A window equal to ``base_window`` is the ratio of the recorded rates; a longer one the ratio of their
    means over the window (the same rates of events, with the window's edges weighted in over
    ``base_window``); a shorter one, which no recording covers, reads the raw series as a ratio of rates.
    """
    base = parse_duration(base_window, promql=True)
    rules = []
    for alert_name, metric in SLO_HISTOGRAMS.items():
        settings = alerts[alert_name]
        if not settings["enabled"]:
            continue
        target = regex("le", bucket_bound(settings["target_seconds"]))
        service_rates = Selector(bucket_rate_record(metric, base_window, PER_SERVICE))
        rules.append(
            {
                "record": service_rates.metric,
                "expr": promql.aggregate(
                    "sum", recorded_bucket_rates(metric, base_window), (*PER_SERVICE, "le")
                ).pretty(),
            }
        )
        windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
        for slo_window in sorted(windows, key=lambda window: parse_duration(window, promql=True)):
            seconds = parse_duration(slo_window, promql=True)
            good = Selector(service_rates.metric, (target,))
            total = Selector(service_rates.metric, (ALL_OBSERVATIONS,))
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
                    selectors.for_serving(f"{metric}_bucket", target),
                    selectors.for_serving(f"{metric}_count"),
                    PER_SERVICE,
                    slo_window,
                )
            rules.append({"record": slo_error_record(metric, slo_window), "expr": (1 - good_share).pretty()})
    return rules
