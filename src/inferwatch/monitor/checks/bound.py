"""Bandwidth- and compute-bound (information, not alarms): decode reading at half the peak memory
bandwidth or more, prefill at half the peak FLOP/s or more (reference/000). No alert watches these: the
thresholds of the alert configuration do not apply."""

from __future__ import annotations

import statistics

from .. import checklist
from ..queries import BANDWIDTH_UTIL, FLOPS_UTIL
from ..units import percent
from .findings import Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import values
from .thresholds import Thresholds

BANDWIDTH_BOUND = 0.5
COMPUTE_BOUND = 0.5


def check_bound(source: Source, limits: Thresholds) -> list[Finding]:
    bandwidth, flops = source.series(BANDWIDTH_UTIL), source.series(FLOPS_UTIL)
    if not (bandwidth or flops):
        raise NotAssessed("no bandwidth or FLOP/s utilization series: they need a CUDA device")
    findings = []
    for group, points in bandwidth.items():
        mean = statistics.fmean(values(points))
        if mean >= BANDWIDTH_BOUND:
            findings.append(
                Finding(
                    "bandwidth-bound",
                    Severity.INFO,
                    subject(group),
                    f"decode reads weights and KV cache at {percent(mean)} of peak memory bandwidth: it is "
                    "memory-bandwidth-bound, so fewer bytes per token is what makes it faster",
                    (
                        evidence_for(
                            source, "decode bandwidth utilization (mean)", percent(mean), BANDWIDTH_UTIL
                        ),
                    ),
                    (checklist.INT4, checklist.BATCHING, checklist.SPECULATIVE),
                )
            )
    for group, points in flops.items():
        mean = statistics.fmean(values(points))
        if mean >= COMPUTE_BOUND:
            findings.append(
                Finding(
                    "compute-bound",
                    Severity.INFO,
                    subject(group),
                    f"prefill runs at {percent(mean)} of peak FLOP/s: it is compute-bound",
                    (evidence_for(source, "prefill FLOP/s utilization (mean)", percent(mean), FLOPS_UTIL),),
                    (checklist.BF16, checklist.SDPA),
                )
            )
    return findings
