"""KV cache nearly full or preempting: the paged KV cache of continuous batching (``llm_kv_cache_blocks``)
held by requests above the InferwatchKvCacheNearlyFull threshold, or its scheduler taking requests off the
device to free blocks (``llm_kv_cache_preemptions_total``) faster than InferwatchKvCachePreemptions allows.

The alert waits for its ``for:``; a diagnosis window is the ``for`` here: the used share is judged by its
mean over the window (a cache full only at one step is a peak, which a continuous-batching scheduler
reaches by design under load). Preemptions are judged by their mean rate against the preemption alert's
``preemptions_above`` per its ``window`` (by default: any preemption). Models without a paged cache
(served by ``generate``) have no blocks: the check is not assessed where no model has one.
"""

from __future__ import annotations

import statistics

from inferwatch.common import names

from .. import checklist
from ..queries import KV_BLOCKS_USED_SHARE, KV_HEADROOM, KV_PREEMPTION_RATE, WAITING
from ..scrape import Labels
from ..units import number, percent
from .findings import Evidence, Finding, NotAssessed, Series, Severity, Source, evidence_for, subject
from .stats import values
from .thresholds import Thresholds

#: What to do about a paged KV cache that is too small for its load, cheapest first.
REMEDIES = (checklist.KV_BLOCKS, checklist.MAX_BATCH_TOKENS, checklist.KV_MAX_NEW_TOKENS, checklist.SCALE_OUT)


def check_kv_cache(source: Source, limits: Thresholds) -> list[Finding]:
    used_share, preemptions = source.series(KV_BLOCKS_USED_SHARE), source.series(KV_PREEMPTION_RATE)
    # A preemption counter at zero is no paged cache: the instrumentation may create it for every model.
    preempting = {group for group, points in preemptions.items() if max(values(points)) > 0}
    if not (used_share or preempting):
        raise NotAssessed(
            f"no {names.LLM_KV_CACHE_BLOCKS} or preemptions in the window: no model has a paged KV cache "
            "(continuous batching)"
        )
    headroom, waiting = source.series(KV_HEADROOM), source.series(WAITING)
    findings = []
    for group in sorted(set(used_share) | preempting):
        share = _mean(used_share.get(group))
        rate = _mean(preemptions.get(group))
        full = share is not None and share > limits.kv_blocks_used_ratio_above
        preempts = rate is not None and rate > limits.preemptions_per_second_above
        if not (full or preempts):
            continue
        evidence = []
        if share is not None:
            now = used_share[group][-1][1]
            evidence.append(
                evidence_for(
                    source,
                    "KV-cache blocks used (mean; now)",
                    f"{percent(share)}; {percent(now)}",
                    KV_BLOCKS_USED_SHARE,
                )
            )
        if rate is not None and rate > 0:
            evidence.append(
                evidence_for(source, "requests preempted per second (mean)", number(rate), KV_PREEMPTION_RATE)
            )
        evidence.extend(_context(source, group, headroom, waiting))
        findings.append(
            Finding(
                "kv-cache",
                Severity.WARNING,
                subject(group),
                _summary(share if full else None, preempts),
                tuple(evidence),
                REMEDIES + ((checklist.CPU_OFFLOAD,) if preempts else ()),
            )
        )
    return findings


def _mean(points: list[tuple[float, float]] | None) -> float | None:
    return statistics.fmean(values(points)) if points else None


def _context(source: Source, group: Labels, headroom: Series, waiting: Series) -> list[Evidence]:
    """What the full cache costs: the tokens its free blocks still hold, and the requests that wait."""
    found = []
    if headroom.get(group):
        now = headroom[group][-1][1]
        found.append(evidence_for(source, "KV-cache headroom (tokens, now)", number(now), KV_HEADROOM))
    mean_waiting = _mean(waiting.get(group))
    if mean_waiting:
        found.append(evidence_for(source, "requests waiting (mean)", number(mean_waiting), WAITING))
    return found


def _summary(full_share: float | None, preempts: bool) -> str:
    if full_share is not None and preempts:
        return (
            f"the paged KV cache is {percent(full_share)} full and the scheduler preempts requests to free "
            "blocks: preempted requests compute their prompt and tokens again"
        )
    if full_share is not None:
        return (
            f"the paged KV cache is {percent(full_share)} full: new requests wait for free blocks, and "
            "running ones get preempted when none is left"
        )
    return (
        "the continuous-batching scheduler preempts requests to free KV-cache blocks: each one computes its "
        "prompt and tokens again"
    )
