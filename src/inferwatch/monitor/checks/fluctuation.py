"""Fluctuation: identical requests whose latency differs by more than 30 % (reference/002 §6.1), measured
as the coefficient of variation of the mean ITL/TTFT between steps of the window against the
InferwatchLatencyFluctuation alert's threshold (30 % by default). It only counts when the workload itself
was steady (mean batch size or prompt length varying by under 10 % between steps): a varying workload
explains varying latency. The alert has no such condition; it judges a 15-minute window of one-minute
means, long enough for a mixed workload to average out, where a diagnosis window may be seconds."""

from __future__ import annotations

import statistics

from .. import checklist
from ..expr import Expr
from ..queries import BATCH_MEAN, ITL_MEAN, PROMPT_TOKENS_MEAN, TTFT_MEAN
from ..units import duration, percent
from .findings import Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import coefficient_of_variation, values
from .thresholds import Thresholds

WORKLOAD_STEADY_COV = 0.10


def _fluctuation(
    source: Source, limit: float, latency: Expr, latency_name: str, workload: Expr, workload_name: str
) -> tuple[list[Finding], bool]:
    findings, judged = [], False
    workload_series = source.series(workload)
    for group, points in source.series(latency).items():
        if len(points) < 3:
            continue
        load = workload_series.get(group)
        if load and len(load) >= 3 and coefficient_of_variation(values(load)) > WORKLOAD_STEADY_COV:
            continue  # a varying workload explains varying latency: not the same requests
        judged = True
        cov = coefficient_of_variation(values(points))
        if cov <= limit:
            continue
        findings.append(
            Finding(
                "fluctuation",
                Severity.WARNING,
                subject(group),
                f"mean {latency_name} varies by {percent(cov)} (coefficient of variation) between steps of a "
                f"steady workload: more than the {percent(limit)} at which identical requests count as "
                "unstable",
                (
                    evidence_for(
                        source,
                        f"mean {latency_name} per step: min / mean / max",
                        " / ".join(duration(f(values(points))) for f in (min, statistics.fmean, max)),
                        latency,
                    ),
                    evidence_for(
                        source,
                        f"{workload_name} per step (coefficient of variation)",
                        percent(coefficient_of_variation(values(load))) if load else "no data",
                        workload,
                    ),
                ),
                (checklist.CLOCKS, checklist.ISOLATION),
            )
        )
    return findings, judged


def check_fluctuation(source: Source, limits: Thresholds) -> list[Finding]:
    limit = limits.coefficient_of_variation_above
    itl, itl_judged = _fluctuation(
        source, limit, ITL_MEAN, "inter-token latency", BATCH_MEAN, "mean batch size"
    )
    ttft, ttft_judged = _fluctuation(
        source, limit, TTFT_MEAN, "time to first token", PROMPT_TOKENS_MEAN, "mean prompt tokens"
    )
    if not (itl_judged or ttft_judged):
        raise NotAssessed("fewer than 3 steps with latency data, or a workload that itself varied")
    return itl + ttft
