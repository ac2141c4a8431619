"""Queueing: requests wait for the model before their first forward (``llm_requests_waiting``, and
``llm_request_queue_seconds`` as a share of time to first token), while the model keeps its device busy:
the model is at capacity, and more replicas or batching are the fix, not a faster kernel.

The number of waiting requests and the p99 queue time are judged against the InferwatchRequestsQueueing
and InferwatchQueueTimeHigh thresholds. The share of TTFT spent in the queue has no alert (TTFT's own
SLO pages on the total); :data:`QUEUE_SHARE_ABOVE` is this check's: from it on, the queue, not prefill,
is most of the wait for the first token, and it counts only while the device is busy (at least
InferwatchHostBound's ``busy_ratio_below``): on an idle model, tokenization before a fast prefill can be
half of a short TTFT without any queue. Both series need a server that reports each request's arrival
(``inferwatch run`` serving transformers serve, the ASGI/WSGI middleware, ``request_arrival``).
"""

from __future__ import annotations

import statistics

from inferwatch.common import names

from .. import checklist
from ..queries import BUSY, QUEUE_MEAN, QUEUE_P99, TTFT_MEAN, WAITING
from ..scrape import Labels
from ..units import duration, number, percent
from .findings import Evidence, Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import aligned, values
from .thresholds import Thresholds

QUEUE_SHARE_ABOVE = 0.5


def check_queueing(source: Source, limits: Thresholds) -> list[Finding]:
    waiting, queue_mean = source.series(WAITING), source.series(QUEUE_MEAN)
    if not (waiting or queue_mean):
        raise NotAssessed(
            f"no {names.LLM_REQUESTS_WAITING} or {names.LLM_REQUEST_QUEUE_SECONDS} in the window: the "
            "server does not report arrivals (inferwatch run, the ASGI/WSGI middleware)"
        )
    queue_p99, ttft_mean, busy = source.series(QUEUE_P99), source.series(TTFT_MEAN), source.series(BUSY)
    findings = []
    for group in sorted(set(waiting) | set(queue_mean)):
        mean_waiting, mean_busy = _mean(waiting.get(group)), _mean(busy.get(group))
        p99 = _mean(queue_p99.get(group))
        pairs = aligned(queue_mean.get(group, []), ttft_mean.get(group, []))
        ttft = statistics.fmean(t for _, t in pairs) if pairs else 0.0
        share = statistics.fmean(q for q, _ in pairs) / ttft if ttft > 0 else None
        evidence: list[Evidence] = []
        if mean_waiting is not None and mean_waiting > limits.requests_waiting_above:
            evidence.append(evidence_for(source, "requests waiting (mean)", number(mean_waiting), WAITING))
        if p99 is not None and p99 > limits.queue_seconds_above:
            evidence.append(evidence_for(source, "queue time p99 (mean)", duration(p99), QUEUE_P99))
        # A large share alone is no queue on an idle model (tokenization and set-up before a fast
        # prefill): it counts while the device is busy.
        at_capacity = mean_busy is not None and mean_busy >= limits.busy_ratio_below
        if share is not None and share > QUEUE_SHARE_ABOVE and at_capacity:
            evidence.append(
                evidence_for(
                    source, "queue share of time to first token", percent(share), QUEUE_MEAN, TTFT_MEAN
                )
            )
        if not evidence:
            continue
        findings.append(_finding(source, limits, group, evidence, mean_busy))
    return findings


def _mean(points: list[tuple[float, float]] | None) -> float | None:
    return statistics.fmean(values(points)) if points else None


def _finding(
    source: Source, limits: Thresholds, group: Labels, evidence: list[Evidence], busy: float | None
) -> Finding:
    if busy is not None:
        evidence.append(evidence_for(source, "device busy ratio (mean)", percent(busy), BUSY))
    if busy is not None and busy < limits.busy_ratio_below:
        # The device has room: the host-bound check names the cause; batching still serves the queue.
        summary = (
            f"requests wait for the model although its device is busy only {percent(busy)} of the time: "
            "the serving loop, not the device, holds them back"
        )
        items = (checklist.OVERLAP, checklist.BATCHING, checklist.COMPILE)
    else:
        busy_text = f"its device is busy {percent(busy)} of the time" if busy is not None else "it serves"
        summary = (
            f"requests wait for the model before their first forward while {busy_text}: the model is at "
            "capacity, so time to first token grows with the queue"
        )
        items = (checklist.SCALE_OUT, checklist.BATCHING, checklist.MAX_TOKENS)
    return Finding("queueing", Severity.WARNING, subject(group), summary, tuple(evidence), items)
