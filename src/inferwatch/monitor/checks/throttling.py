"""Throttling (reference/002 §6.1: is the GPU downclocking?): a clocks-event reason that the throttling
alerts list (InferwatchGpuHardwareSlowdown's and InferwatchGpuClocksThrottled's: not idle, application or
display clock settings, sync boost or low utilization) active at some step, or a violation counter of
InferwatchGpuThrottleDutyCycleHigh's reasons above its duty cycle (25 % of the time by default). A reason
of the hardware slowdown alert makes the finding critical."""

from __future__ import annotations

import statistics

from .. import checklist
from ..queries import CLOCK_EVENT_ACTIVE, CLOCK_EVENT_DUTY, GPU_UTIL, SM_CLOCK_SHARE
from ..scrape import Labels
from ..units import percent
from .attribution import serving_on
from .findings import Evidence, Finding, NotAssessed, Series, Severity, Source, evidence_for, subject
from .stats import values
from .thresholds import Thresholds


def check_throttling(source: Source, limits: Thresholds) -> list[Finding]:
    active, duty = source.series(CLOCK_EVENT_ACTIVE), source.series(CLOCK_EVENT_DUTY)
    if not (active or duty):
        raise NotAssessed("no gpu_clocks_event_* series in the window: is inferwatch-exporter scraped?")
    clock_share, utilization = source.series(SM_CLOCK_SHARE), source.series(GPU_UTIL)
    serving = serving_on(source)
    findings = []
    for gpu, (names, evidence) in sorted(_throttled_gpus(source, active, duty, limits).items()):
        hardware = any(reason in limits.hardware_reasons for reason in names)
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
                f"clocks held down by {', '.join(names)}: every kernel runs slower, and latency varies"
                + serving(gpu),
                tuple(evidence),
                (checklist.CLOCKS,),
            )
        )
    return findings


def _throttled_gpus(
    source: Source, active: Series, duty: Series, limits: Thresholds
) -> dict[Labels, tuple[list[str], list[Evidence]]]:
    """GPU -> the reasons that held its clocks down in the window, and the evidence of each."""
    gpus: dict[Labels, tuple[list[str], list[Evidence]]] = {}
    for group in sorted(set(active) | set(duty)):
        reason = dict(group).get("reason", "")
        # The 0/1 gauge samples the moment of each poll; the violation counter misses no episode.
        judged_active = group in active and reason in limits.throttling_reasons
        judged_duty = group in duty and reason in limits.duty_cycle_reasons
        share = (
            statistics.fmean(1.0 if v > 0 else 0.0 for v in values(active[group])) if judged_active else 0.0
        )
        throttled = statistics.fmean(values(duty[group])) if judged_duty else 0.0
        # One active step is enough, where InferwatchGpuClocksThrottled also wants the SM clock under 90 % of
        # its maximum on a busy GPU for 10m: an alert pages for a sustained loss, a diagnosis explains a slow
        # window, so it names every reason seen and shows the clock share and utilization as evidence.
        if share == 0 and throttled <= limits.duty_cycle_ratio_above:
            continue
        names, evidence = gpus.setdefault(tuple((k, v) for k, v in group if k != "reason"), ([], []))
        names.append(reason)
        if judged_active:
            what = f"{reason} active (share of the steps)"
            evidence.append(evidence_for(source, what, percent(share), CLOCK_EVENT_ACTIVE))
        if judged_duty:
            what = f"time held back by {reason} (violation counter)"
            evidence.append(evidence_for(source, what, percent(throttled), CLOCK_EVENT_DUTY))
    return gpus
