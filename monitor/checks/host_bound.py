"""Host-bound: the model's own work fills less of the wall time while requests run than the
InferwatchHostBound alert allows (reference/002 §4.1: idle gaps in the timeline); the busiest serving
process's CPU is the evidence."""

from __future__ import annotations

import statistics

from inferwatch.common import names

from .. import checklist
from ..queries import BUSY, PROCESS_CPU_RATE, RUNNING
from ..units import number, percent
from .findings import Evidence, Finding, NotAssessed, Severity, Source, evidence_for, host, subject
from .stats import aligned, values
from .thresholds import Thresholds


def check_host_bound(source: Source, limits: Thresholds) -> list[Finding]:
    busy = source.series(BUSY)
    if not busy:
        raise NotAssessed(f"no {names.LLM_GPU_BUSY_RATIO} in the window: is an instrumented process scraped?")
    running = source.series(RUNNING)
    findings, judged = [], False
    for group, busy_points in busy.items():
        loaded = [
            (b, r)
            for b, r in aligned(busy_points, running.get(group, []))
            if r > limits.requests_running_above
        ]
        if not loaded:
            continue
        judged = True
        mean_busy = statistics.fmean(b for b, _ in loaded)
        if mean_busy >= limits.busy_ratio_below:
            continue
        evidence = [
            evidence_for(source, "busy ratio while requests run (mean)", percent(mean_busy), BUSY),
            evidence_for(
                source,
                "requests running (mean of those steps)",
                number(statistics.fmean(r for _, r in loaded)),
                RUNNING,
            ),
        ]
        evidence.extend(_process_cpu_evidence(source, host(group)))
        findings.append(
            Finding(
                "host-bound",
                Severity.WARNING,
                subject(group),
                f"the model's forward passes fill only {percent(mean_busy)} of the wall time while "
                f"requests run: the serving loop on the host, not the device, sets the pace",
                tuple(evidence),
                (checklist.OVERLAP, checklist.COMPILE, checklist.BATCHING),
            )
        )
    if not judged:
        raise NotAssessed("no requests ran while the busy ratio was measured")
    return findings


def _process_cpu_evidence(source: Source, on_host: str) -> list[Evidence]:
    """The busiest serving process the exporter watches on the same host: a Python loop that holds one
    core near 100 % is the host-bound signature on a GPU machine."""
    cpu = {
        group: statistics.fmean(values(points))
        for group, points in source.series(PROCESS_CPU_RATE).items()
        if host(group) == on_host
    }
    if not cpu:
        return []
    busiest = max(cpu, key=cpu.__getitem__)
    labels = dict(busiest)
    return [
        evidence_for(
            source,
            f"CPU of the busiest serving process on the host, {labels.get('comm')} ({labels.get('pid')})",
            f"{cpu[busiest]:.2f} cores",
            PROCESS_CPU_RATE,
        )
    ]
