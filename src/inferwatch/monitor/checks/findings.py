"""What a check returns and reads: findings with their evidence, the source of series, and the verdict.

A check reads a few expressions (:mod:`inferwatch.monitor.expr`) as series over a window from a
:class:`Source` and returns :class:`Finding` values; one that has no data to judge raises
:class:`NotAssessed` instead of passing silently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from ..checklist import ChecklistItem
from ..expr import Expr
from ..scrape import Labels

# Group labels -> (time, value) points in time order.
Series = dict[Labels, list[tuple[float, float]]]


class Source(Protocol):
    """Where the series come from."""

    #: The range of ``rate()`` in the queries shown as evidence (``1m``; ``2s`` between two scrapes).
    rate_window: str

    def series(self, expr: Expr) -> Series: ...


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Evidence:
    what: str
    value: str
    query: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "value": self.value, "query": self.query}


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    subject: str
    summary: str
    evidence: tuple[Evidence, ...]
    checklist: tuple[ChecklistItem, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "severity": str(self.severity),
            "subject": self.subject,
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "checklist": [item.to_dict() for item in self.checklist],
        }


class NotAssessed(Exception):
    """A check had no data to judge; the message says what was missing."""


@dataclass
class Diagnosis:
    findings: list[Finding] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)  # checks that had data and found nothing
    not_assessed: dict[str, str] = field(default_factory=dict)  # check -> why not

    @property
    def alarming(self) -> bool:
        return any(f.severity >= Severity.WARNING for f in self.findings)

    @property
    def assessed(self) -> bool:
        """Whether any check had data: a diagnosis of nothing is not a clean bill of health."""
        return bool(self.findings or self.passed)

    def to_dict(self) -> dict[str, object]:
        return {
            "alarming": self.alarming,
            "findings": [f.to_dict() for f in self.findings],
            "passed": self.passed,
            "not_assessed": self.not_assessed,
        }


def subject(group: Labels) -> str:
    labels = dict(group)
    where = f" on {labels['instance']}" if "instance" in labels else ""
    if "gpu" in labels:
        return f"GPU {labels['gpu']}{where}"
    if "model" in labels:
        return f"model {labels['model']}{where}"
    if "device" in labels:
        return f"device {labels['device']}{where}"
    return f"process{where}" if where else "all"


def gpm_series(source: Source, expr: Expr, metric: str) -> Series:
    """The series of an expression over the exporter's GPM figures (``metric``); NotAssessed where there
    are none: a GPU before Hopper, or no exporter scraped."""
    found = source.series(expr)
    if not found:
        raise NotAssessed(
            f"no {metric} in the window: it needs inferwatch-exporter on a GPU with NVML GPM "
            "(Hopper or newer)"
        )
    return found


def evidence_for(source: Source, what: str, value: str, *exprs: Expr) -> Evidence:
    """Evidence whose query is the PromQL of ``exprs``, one per line."""
    return Evidence(what, value, "\n".join(expr.promql(source.rate_window) for expr in exprs))
