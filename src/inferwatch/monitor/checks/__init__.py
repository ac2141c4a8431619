"""The bottleneck matrix and fault list of the reference notes, as checks over metric time series.

Each check reads a few expressions (:mod:`inferwatch.monitor.expr`) as series over a window from a
:class:`~.findings.Source` - a Prometheus server, or endpoints scraped repeatedly - and returns findings:
what is wrong, how bad, the numbers and queries that show it, and the checklist items that address it. A
check that has no data to judge (no GPU exporter scraped, no requests ran, too little variation to fit a
scaling law) says so instead of passing silently.

One check per module, each with its thresholds and where they come from: :mod:`.host_bound`,
:mod:`.launch_bound`, :mod:`.throttling`, :mod:`.fluctuation`, :mod:`.oom_risk`, :mod:`.kv_cache`,
:mod:`.leak`, :mod:`.bound`, :mod:`.tensor_cores`, :mod:`.scaling` and :mod:`.queueing`. :mod:`.findings` is
what they return, :mod:`.stats` the arithmetic they share, and :mod:`.thresholds` what they judge against:
the alert configuration's, so that a diagnosis does not contradict an alert.
"""

from __future__ import annotations

from collections.abc import Callable

from .bound import check_bound
from .findings import Diagnosis, Finding, NotAssessed, Series, Severity, Source
from .fluctuation import check_fluctuation
from .host_bound import check_host_bound
from .kv_cache import check_kv_cache
from .launch_bound import check_launch_bound
from .leak import check_leaks
from .oom_risk import check_oom_risk
from .queueing import check_queueing
from .scaling import check_scaling
from .tensor_cores import check_tensor_cores
from .thresholds import Thresholds
from .throttling import check_throttling

__all__ = ["CHECKS", "Diagnosis", "Series", "Severity", "Thresholds", "diagnose"]

CHECKS: tuple[tuple[str, Callable[[Source, Thresholds], list[Finding]]], ...] = (
    ("host-bound", check_host_bound),
    ("launch-bound", check_launch_bound),
    ("queueing", check_queueing),
    ("throttling", check_throttling),
    ("fluctuation", check_fluctuation),
    ("oom-risk", check_oom_risk),
    ("kv-cache", check_kv_cache),
    ("leak", check_leaks),
    ("bandwidth/compute-bound", check_bound),
    ("tensor-cores", check_tensor_cores),
    ("scaling", check_scaling),
)


def diagnose(source: Source, limits: Thresholds) -> Diagnosis:
    """Run every check against ``limits`` (:meth:`Thresholds.from_alerts`); findings most severe first."""
    result = Diagnosis()
    for name, check in CHECKS:
        try:
            found = check(source, limits)
        except NotAssessed as exc:
            result.not_assessed[name] = str(exc)
            continue
        if found:
            result.findings.extend(found)
        else:
            result.passed.append(name)
    result.findings.sort(key=lambda f: -f.severity)
    return result
