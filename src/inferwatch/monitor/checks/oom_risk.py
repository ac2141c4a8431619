"""OOM risk: under 10 % of device memory free (5 %: critical), allocator retries, OOMs, or less KV-cache
headroom than the InferwatchKvCacheHeadroomLow alert's threshold or one average request needs
(reference/002 §6.2). With continuous batching the headroom is what the free blocks of the paged cache
hold, and the remedies are the paged cache's (:mod:`.kv_cache`), not a paged cache."""

from __future__ import annotations

import statistics

from .. import checklist
from ..queries import (
    ALLOC_RETRY_RATE,
    GENERATION_TOKENS_MEAN,
    KV_BLOCKS_TOTAL,
    KV_HEADROOM,
    MEMORY_FREE_SHARE,
    OOM_RATE,
    PROMPT_TOKENS_MEAN,
)
from ..units import number, percent
from .findings import Finding, NotAssessed, Series, Severity, Source, evidence_for, subject
from .kv_cache import REMEDIES as PAGED_CACHE_REMEDIES
from .stats import values
from .thresholds import Thresholds

# InferwatchGpuMemoryFillingUp pairs 80 % used with a trend that reaches the total within the hour; a
# diagnosis window is too short to project an hour ahead, so it judges the free share now, at levels
# where the next long prompt or bigger batch fails.
MEMORY_FREE_WARNING = 0.10
MEMORY_FREE_CRITICAL = 0.05


def check_oom_risk(source: Source, limits: Thresholds) -> list[Finding]:
    free_share = source.series(MEMORY_FREE_SHARE)
    ooms, retries = source.series(OOM_RATE), source.series(ALLOC_RETRY_RATE)
    headroom = source.series(KV_HEADROOM)
    if not (free_share or ooms or retries or headroom):
        raise NotAssessed("no device memory, KV-cache headroom, allocator or OOM series")
    return [
        *_low_free_memory(source, free_share),
        *_allocator_events(source, ooms, retries),
        *_low_headroom(source, headroom, limits.headroom_tokens_below),
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
    # One allocator retry in the window is a finding, where InferwatchAllocatorRetries waits for more than
    # 3 in 15m before it pages: in the window a person asks about, each retry was a stalled step.
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


def _low_headroom(source: Source, headroom: Series, limit: float) -> list[Finding]:
    """Less KV-cache headroom than InferwatchKvCacheHeadroomLow's threshold, or than one average request."""
    findings = []
    prompt, generated = source.series(PROMPT_TOKENS_MEAN), source.series(GENERATION_TOKENS_MEAN)
    paged = set(source.series(KV_BLOCKS_TOTAL)) if headroom else set()
    for group, points in headroom.items():
        now = points[-1][1]
        per_request = None
        if prompt.get(group) and generated.get(group):
            per_request = statistics.fmean(values(prompt[group])) + statistics.fmean(values(generated[group]))
        if now >= limit and (per_request is None or now >= per_request):
            continue
        evidence = [evidence_for(source, "KV-cache headroom (tokens, now)", number(now), KV_HEADROOM)]
        summary = f"the KV cache has room for fewer than {number(limit)} more tokens"
        if per_request is not None:
            what = "tokens per request (prompt + generated, mean)"
            evidence.append(
                evidence_for(source, what, number(per_request), PROMPT_TOKENS_MEAN, GENERATION_TOKENS_MEAN)
            )
            if now < per_request:
                summary = "the KV cache has less headroom than one average request needs"
        items = PAGED_CACHE_REMEDIES if group in paged else (checklist.MEMORY,)
        findings.append(
            Finding("oom-risk", Severity.WARNING, subject(group), summary, tuple(evidence), items)
        )
    return findings
