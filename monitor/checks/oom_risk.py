"""OOM risk: under 10 % of device memory free (5 %: critical), allocator retries, OOMs, or less KV-cache
headroom than one average request needs (reference/002 §6.2)."""

from __future__ import annotations

import statistics

from .. import checklist
from ..queries import (
    ALLOC_RETRY_RATE,
    GENERATION_TOKENS_MEAN,
    KV_HEADROOM,
    MEMORY_FREE_SHARE,
    OOM_RATE,
    PROMPT_TOKENS_MEAN,
)
from ..units import number, percent
from .findings import Finding, NotAssessed, Series, Severity, Source, evidence_for, subject
from .stats import values

MEMORY_FREE_WARNING = 0.10
MEMORY_FREE_CRITICAL = 0.05


def check_oom_risk(source: Source) -> list[Finding]:
    free_share = source.series(MEMORY_FREE_SHARE)
    ooms, retries = source.series(OOM_RATE), source.series(ALLOC_RETRY_RATE)
    headroom = source.series(KV_HEADROOM)
    if not (free_share or ooms or retries or headroom):
        raise NotAssessed("no device memory, KV-cache headroom, allocator or OOM series")
    return [
        *_low_free_memory(source, free_share),
        *_allocator_events(source, ooms, retries),
        *_low_headroom(source, headroom),
    ]


def _low_free_memory(source: Source, free_share: Series) -> list[Finding]:
    findings = []
    for group, points in free_share.items():
        now = points[-1][1]
        if now >= MEMORY_FREE_WARNING:
            continue
        findings.append(
            Finding(
                "oom-risk",
                Severity.CRITICAL if now < MEMORY_FREE_CRITICAL else Severity.WARNING,
                subject(group),
                f"only {percent(now)} of device memory is free",
                (
                    evidence_for(
                        source,
                        "free / total device memory: now (lowest in window)",
                        f"{percent(now)} ({percent(min(values(points)))})",
                        MEMORY_FREE_SHARE,
                    ),
                ),
                (checklist.MEMORY,),
            )
        )
    return findings


def _allocator_events(source: Source, ooms: Series, retries: Series) -> list[Finding]:
    findings = []
    for expr, series, severity, what in (
        (OOM_RATE, ooms, Severity.CRITICAL, "out-of-memory errors"),
        (ALLOC_RETRY_RATE, retries, Severity.WARNING, "allocator retries (the cache was flushed to fit)"),
    ):
        for group, points in series.items():
            if max(values(points)) <= 0:
                continue
            findings.append(
                Finding(
                    "oom-risk",
                    severity,
                    subject(group),
                    f"{what} happened in the window",
                    (evidence_for(source, f"{what} per second (peak)", number(max(values(points))), expr),),
                    (checklist.MEMORY,),
                )
            )
    return findings


def _low_headroom(source: Source, headroom: Series) -> list[Finding]:
    findings = []
    prompt, generated = source.series(PROMPT_TOKENS_MEAN), source.series(GENERATION_TOKENS_MEAN)
    for group, points in headroom.items():
        if not (prompt.get(group) and generated.get(group)):
            continue
        per_request = statistics.fmean(values(prompt[group])) + statistics.fmean(values(generated[group]))
        if points[-1][1] >= per_request:
            continue
        findings.append(
            Finding(
                "oom-risk",
                Severity.WARNING,
                subject(group),
                "the KV cache has less headroom than one average request needs",
                (
                    evidence_for(
                        source, "KV-cache headroom (tokens, now)", number(points[-1][1]), KV_HEADROOM
                    ),
                    evidence_for(
                        source,
                        "tokens per request (prompt + generated, mean)",
                        number(per_request),
                        PROMPT_TOKENS_MEAN,
                        GENERATION_TOKENS_MEAN,
                    ),
                ),
                (checklist.MEMORY,),
            )
        )
    return findings
