"""Throttling: any clocks-event reason other than idle, application or display clock settings, sync boost
and low utilization, active or accumulating more than 5 % throttle time (reference/002 §6.1: is the GPU
downclocking?)."""

from __future__ import annotations

import statistics

from .. import checklist
from ..queries import BENIGN_CLOCK_REASONS, CLOCK_EVENT_ACTIVE, CLOCK_EVENT_DUTY, GPU_UTIL, SM_CLOCK_SHARE
from ..scrape import Labels
from ..units import percent
from .findings import Evidence, Finding, NotAssessed, Series, Severity, Source, evidence_for, subject
from .stats import values

THROTTLE_DUTY_CYCLE = 0.05


def check_throttling(source: Source) -> list[Finding]:
    active, duty = source.series(CLOCK_EVENT_ACTIVE), source.series(CLOCK_EVENT_DUTY)
    if not (active or duty):
        raise NotAssessed("no gpu_clocks_event_* series in the window: is inferwatch-exporter scraped?")
    clock_share, utilization = source.series(SM_CLOCK_SHARE), source.series(GPU_UTIL)
    findings = []
    for gpu, (names, evidence) in sorted(_throttled_gpus(source, active, duty).items()):
        hardware = any(reason.startswith("hw_") for reason in names)
        for what, series, expr in (
            ("SM clock / its maximum (mean)", clock_share, SM_CLOCK_SHARE),
            ("GPU utilization (mean)", utilization, GPU_UTIL),
        ):
            if gpu in series:
                evidence.append(
                    evidence_for(source, what, percent(statistics.fmean(values(series[gpu]))), expr)
                )
        findings.append(
            Finding(
                "throttling",
                Severity.CRITICAL if hardware else Severity.WARNING,
                subject(gpu),
                f"clocks held down by {', '.join(names)}: every kernel runs slower, and latency varies",
                tuple(evidence),
                (checklist.CLOCKS,),
            )
        )
    return findings


def _throttled_gpus(
    source: Source, active: Series, duty: Series
) -> dict[Labels, tuple[list[str], list[Evidence]]]:
    """GPU -> the reasons that held its clocks down in the window, and the evidence of each."""
    gpus: dict[Labels, tuple[list[str], list[Evidence]]] = {}
    for group in sorted(set(active) | set(duty)):
        reason = dict(group).get("reason", "")
        if reason in BENIGN_CLOCK_REASONS:
            continue
        # The 0/1 gauge samples the moment of each poll; the violation counter misses no episode.
        share = (
            statistics.fmean(1.0 if v > 0 else 0.0 for v in values(active[group])) if group in active else 0.0
        )
        throttled = statistics.fmean(values(duty[group])) if group in duty else 0.0
        if share == 0 and throttled <= THROTTLE_DUTY_CYCLE:
            continue
        names, evidence = gpus.setdefault(tuple((k, v) for k, v in group if k != "reason"), ([], []))
        names.append(reason)
        if group in active:
            what = f"{reason} active (share of the steps)"
            evidence.append(evidence_for(source, what, percent(share), CLOCK_EVENT_ACTIVE))
        if group in duty:
            what = f"time held back by {reason} (violation counter)"
            evidence.append(evidence_for(source, what, percent(throttled), CLOCK_EVENT_DUTY))
    return gpus
