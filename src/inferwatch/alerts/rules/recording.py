"""The recording rules: latency quantiles per model, the mean inter-token latency per replica, and the
SLO error ratios the budget-burn alerts read.

What a rule costs grows with the series it reads, so the raw buckets of a histogram are read once per
evaluation, by one rule that sums their rates per job, model and ``le`` (``job_model:<histogram>_bucket:
rate<window>``): every other rule over that histogram reads the recording, whose series are models x
buckets however many instances serve them. The quantiles (``recording.quantiles``) and the SLO error
ratios read it; a longer SLO window is the ratio of the recorded rates' means over it. So a fleet's
evaluation reads each instance's buckets once per histogram instead of once per quantile, and the rest
grows with models (docs/alerts.md, "Cost at fleet scale").

Per-instance quantiles are not recorded: no alert reads them, and a dashboard that shows one replica asks
for its quantile over the one instance it shows, at query time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import Call, Number, Selector, eq, num, regex

from ..config import Selectors
from .base import bucket_bound, per_model_ratio

# An SLO and a recorded quantile are the service's: recorded per job and model, over every instance.
PER_SERVICE = ("job", "model")

GROUP_RECORDING = "inferwatch-recording"

# The histograms whose quantiles are recorded.
QUANTILE_HISTOGRAMS = (
    names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    names.LLM_REQUEST_QUEUE_SECONDS,
    names.LLM_INTER_TOKEN_LATENCY_SECONDS,
    names.LLM_E2E_REQUEST_LATENCY_SECONDS,
)

# End-to-end latency as dashboards and rules read it: of served requests only (a cancelled request's ends
# when its client left, not when it was answered).
SERVED = eq("outcome", "ok")
# The series of a histogram that its recorded quantiles read.
HISTOGRAM_MATCHERS = {names.LLM_E2E_REQUEST_LATENCY_SECONDS: (SERVED,)}

# The SLO alerts and the histogram each one reads.
SLO_HISTOGRAMS = {
    "InferwatchTimeToFirstTokenBudgetBurn": names.LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    "InferwatchInterTokenLatencyBudgetBurn": names.LLM_INTER_TOKEN_LATENCY_SECONDS,
}


def quantile_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, model) quantiles of histogram ``metric`` (:data:`PER_SERVICE`)."""
    return f"job_model:{metric}:quantile_rate{window}"


def mean_record(metric: str, window: str) -> str:
    """Name of the recorded per-(job, instance, model) mean of histogram ``metric``."""
    return f"instance_model:{metric}:mean_rate{window}"


def bucket_rate_record(metric: str, window: str) -> str:
    """Name of the recorded bucket rates of histogram ``metric``, summed per (job, model) and ``le``
    (:data:`PER_SERVICE`): the one rule that reads the histogram's raw buckets."""
    return f"job_model:{metric}_bucket:rate{window}"


def slo_error_record(metric: str, window: str) -> str:
    """Name of the recorded fraction of ``metric`` observations above the SLO target, per (job, model)
    (:data:`PER_SERVICE`)."""
    return f"job_model:{metric}:slo_error_ratio_rate{window}"


def recording_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recording rules, in the order they read each other: bucket rates, quantiles, the mean, the SLO
    error ratios (Prometheus runs one group's rules in order at one timestamp)."""
    selectors = Selectors.of(config)
    rec, alerts = config["recording"], config["alerts"]
    window = rec["quantile_window"]
    slos = {name: metric for name, metric in SLO_HISTOGRAMS.items() if alerts[name]["enabled"]}
    histograms = dict.fromkeys([*(QUANTILE_HISTOGRAMS if rec["quantiles"] else ()), *slos.values()])
    buckets = [
        {
            "record": bucket_rate_record(metric, window),
            "expr": promql.sum_rate(
                selectors.for_serving(f"{metric}_bucket", *HISTOGRAM_MATCHERS.get(metric, ())),
                (*PER_SERVICE, "le"),
                window,
            ).pretty(),
        }
        for metric in histograms
    ]
    quantiles = [
        {
            "record": quantile_record(metric, window),
            "expr": Call(
                "histogram_quantile", (Number(quantile), Selector(bucket_rate_record(metric, window)))
            ).pretty(),
            "labels": {"quantile": num(quantile)},
        }
        for metric in QUANTILE_HISTOGRAMS
        for quantile in rec["quantiles"]
    ]
    itl = selectors.for_serving(names.LLM_INTER_TOKEN_LATENCY_SECONDS)
    mean_window = alerts["InferwatchLatencyFluctuation"]["mean_window"]
    mean = {
        "record": mean_record(names.LLM_INTER_TOKEN_LATENCY_SECONDS, mean_window),
        "expr": per_model_ratio(itl.suffixed("_sum"), itl.suffixed("_count"), mean_window).pretty(),
    }
    slo = [
        rule
        for name, metric in slos.items()
        for rule in _slo_error_rules(selectors, metric, alerts[name], window)
    ]
    return [*buckets, *quantiles, mean, *slo]


def _slo_error_rules(
    selectors: Selectors, metric: str, settings: Mapping[str, Any], base_window: str
) -> list[dict[str, Any]]:
    """The error ratio of one SLO over every window its alert reads, from the bucket rates recorded over
    ``base_window``.

    A window equal to ``base_window`` is the ratio of the recorded rates; a longer one the ratio of their
    means over the window (the same rates of events weighted by traffic, with the window's edges weighed
    in over ``base_window``); a shorter one, which no recording covers, reads the raw series.
    """
    base = parse_duration(base_window, promql=True)
    bound = bucket_bound(settings["target_seconds"])
    recorded = bucket_rate_record(metric, base_window)
    good = Selector(recorded, (regex("le", bound),))
    total = Selector(recorded, (eq("le", "+Inf"),))
    windows = {settings[speed][w] for speed in ("fast", "slow") for w in ("long_window", "short_window")}
    rules = []
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
