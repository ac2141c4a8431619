"""The bottleneck matrix's scaling rows: a power law fitted to latency against prompt length, output
length or batch size, when those varied by x1.5 or more in the window and the fit explains the points
(R² 0.8). No alert watches these: the thresholds of the alert configuration do not apply."""

from __future__ import annotations

from dataclasses import dataclass

from .. import checklist
from ..checklist import ChecklistItem
from ..expr import Expr
from ..queries import (
    BATCH_MEAN,
    DECODE_FORWARD_MEAN,
    GENERATION_TOKENS_MEAN,
    PREFILL_MEAN,
    PROMPT_TOKENS_MEAN,
    TPOT_MEAN,
)
from .findings import Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import aligned, loglog_fit
from .thresholds import Thresholds

SCALING_MIN_POINTS = 5
SCALING_MIN_SPREAD = 1.5
SCALING_MIN_R_SQUARED = 0.8


@dataclass(frozen=True)
class _Scaling:
    x: Expr
    x_name: str
    y: Expr
    y_name: str
    threshold: float  # exponent at or above which the row of the matrix applies
    severity: Severity
    summary: str
    remedies: tuple[ChecklistItem, ...]


_SCALINGS = (
    _Scaling(
        PROMPT_TOKENS_MEAN, "prompt tokens", PREFILL_MEAN, "prefill time", 1.6, Severity.WARNING,
        "prefill time grows as prompt length^{k:.2f}, close to quadratic: attention is not optimized",
        (checklist.SDPA, checklist.KV_CACHE),
    ),
    _Scaling(
        GENERATION_TOKENS_MEAN, "generated tokens", TPOT_MEAN, "time per output token", 0.8, Severity.WARNING,
        "time per output token grows as output length^{k:.2f}: each decode step redoes attention over the "
        "whole sequence (total time quadratic in the sequence) - is the KV cache used?",
        (checklist.KV_CACHE,),
    ),
    _Scaling(
        BATCH_MEAN, "batch size", DECODE_FORWARD_MEAN, "decode step time", 0.8, Severity.INFO,
        "decode step time grows as batch size^{k:.2f}, about linearly: the matrix reads this as a "
        "memory-bandwidth bottleneck (check the bandwidth utilization)",
        (checklist.INT4, checklist.SPECULATIVE),
    ),
)  # fmt: skip


def check_scaling(source: Source, limits: Thresholds) -> list[Finding]:
    findings, judged = [], False
    for scaling in _SCALINGS:
        xs, ys = source.series(scaling.x), source.series(scaling.y)
        for group, x_points in xs.items():
            pairs = [(x, y) for x, y in aligned(x_points, ys.get(group, [])) if x > 0 and y > 0]
            if len(pairs) < SCALING_MIN_POINTS:
                continue
            low, high = min(x for x, _ in pairs), max(x for x, _ in pairs)
            if high / low < SCALING_MIN_SPREAD:
                continue
            judged = True
            exponent, r_squared = loglog_fit([x for x, _ in pairs], [y for _, y in pairs])
            # A steep slope through scattered points is noise, not a scaling law.
            if exponent < scaling.threshold or r_squared < SCALING_MIN_R_SQUARED:
                continue
            findings.append(
                Finding(
                    "scaling",
                    scaling.severity,
                    subject(group),
                    scaling.summary.format(k=exponent),
                    (
                        evidence_for(
                            source,
                            f"fitted exponent of {scaling.y_name} against {scaling.x_name} "
                            f"({len(pairs)} steps, {scaling.x_name} {low:.3g}..{high:.3g}, "
                            f"R² {r_squared:.2f})",
                            f"{exponent:.2f}",
                            scaling.y,
                            scaling.x,
                        ),
                    ),
                    scaling.remedies,
                )
            )
    if not judged:
        raise NotAssessed(
            f"prompt lengths, output lengths and batch sizes did not vary by x{SCALING_MIN_SPREAD} over "
            f"{SCALING_MIN_POINTS}+ steps: no scaling law to fit"
        )
    return findings
