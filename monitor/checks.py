"""The bottleneck matrix and fault list of the reference notes, as checks over metric time series.

Each check reads a few expressions (:mod:`inferwatch.monitor.expr`) as series over a window from a
:class:`Source` - a Prometheus server, or endpoints scraped repeatedly - and returns findings: what is
wrong, how bad, the numbers and queries that show it, and the checklist items that address it. A check
that has no data to judge (no GPU exporter scraped, no requests ran, too little variation to fit a
scaling law) says so instead of passing silently.

Thresholds and where they come from:

* fluctuation: identical requests whose latency differs by more than 30 % (reference/002 §6.1),
  measured as the coefficient of variation of the mean ITL/TTFT between steps of the window;
* host-bound: the model's own work fills less than half of the wall time while requests run
  (reference/002 §4.1: idle gaps in the timeline);
* throttling: any clocks-event reason other than idle, application or display clock settings, sync
  boost and low utilization, active or accumulating more than 5 % throttle time (reference/002 §6.1:
  is the GPU downclocking?);
* OOM risk: under 10 % of device memory free (5 %: critical), allocator retries, OOMs, or less KV-cache
  headroom than one average request needs (reference/002 §6.2);
* leak: memory rising by more than 5 % over the window, step after step, while the load does not rise;
* fluctuation only counts when the workload itself was steady (mean batch size or prompt length varying
  by under 10 % between steps): a varying workload explains varying latency;
* the matrix's scaling rows: a power law fitted to latency against prompt length, output length or
  batch size, when those varied by x1.5 or more in the window and the fit explains the points (R² 0.8);
* bandwidth- and compute-bound (information, not alarms): decode reading at half the peak memory
  bandwidth or more, prefill at half the peak FLOP/s or more.
"""

from __future__ import annotations

import enum
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferwatch.monitor import checklist
from inferwatch.monitor.checklist import ChecklistItem
from inferwatch.monitor.expr import Expr
from inferwatch.monitor.queries import (
    ALLOC_RETRY_RATE,
    BANDWIDTH_UTIL,
    BATCH_MEAN,
    BENIGN_CLOCK_REASONS,
    BUSY,
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_DUTY,
    DECODE_FORWARD_MEAN,
    FLOPS_UTIL,
    GENERATION_TOKENS_MEAN,
    GPU_MEMORY_USED,
    GPU_UTIL,
    ITL_MEAN,
    KV_HEADROOM,
    MEMORY_FREE_SHARE,
    OOM_RATE,
    PREFILL_MEAN,
    PROCESS_CPU_RATE,
    PROMPT_TOKENS_MEAN,
    RUNNING,
    SERVING_INSTANCES,
    SERVING_RSS,
    SM_CLOCK_SHARE,
    TORCH_ALLOCATED,
    TOTAL_TOKENS_RATE,
    TPOT_MEAN,
    TTFT_MEAN,
)
from inferwatch.monitor.scrape import Labels
from inferwatch.monitor.units import duration, number, percent, size

# Group labels -> (time, value) points in time order.
Series = dict[Labels, list[tuple[float, float]]]

FLUCTUATION_COV = 0.30
WORKLOAD_STEADY_COV = 0.10
HOST_BOUND_BUSY_RATIO = 0.5
THROTTLE_DUTY_CYCLE = 0.05
MEMORY_FREE_WARNING = 0.10
MEMORY_FREE_CRITICAL = 0.05
LEAK_GROWTH = 0.05
LEAK_RISING_STEPS = 0.7
LEAK_LOAD_GROWTH = 1.2
SCALING_MIN_POINTS = 5
SCALING_MIN_SPREAD = 1.5
SCALING_MIN_R_SQUARED = 0.8
BANDWIDTH_BOUND = 0.5
COMPUTE_BOUND = 0.5


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


# --- subjects -----------------------------------------------------------------------------------------


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


# --- series arithmetic --------------------------------------------------------------------------------


def values(points: Sequence[tuple[float, float]]) -> list[float]:
    return [v for _, v in points]


def coefficient_of_variation(xs: Sequence[float]) -> float:
    mean = statistics.fmean(xs)
    return statistics.pstdev(xs) / mean if mean else math.inf


def aligned(*series: Sequence[tuple[float, float]]) -> list[tuple[float, ...]]:
    """Values of several series at the times all of them have a point (range queries share steps)."""
    by_time = [dict(points) for points in series]
    common = sorted(set.intersection(*(set(points) for points in by_time)))
    return [tuple(points[t] for points in by_time) for t in common]


def loglog_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares exponent k of y ~ x^k, and the R² of that fit in log-log space."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    syy = sum((b - my) ** 2 for b in ly)
    sxy = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return sxy / sxx, (sxy * sxy / (sxx * syy) if syy else 1.0)


def linear_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of value over time (per second)."""
    ts, vs = [t for t, _ in points], values(points)
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    denominator = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (v - mv) for t, v in zip(ts, vs, strict=True)) / denominator if denominator else 0.0


# --- the checks ---------------------------------------------------------------------------------------


def _evidence(source: Source, what: str, value: str, *exprs: Expr) -> Evidence:
    """Evidence whose query is the PromQL of ``exprs``, one per line."""
    return Evidence(what, value, "\n".join(expr.promql(source.rate_window) for expr in exprs))


def check_host_bound(source: Source) -> list[Finding]:
    busy = source.series(BUSY)
    if not busy:
        raise NotAssessed("no llm_gpu_busy_ratio in the window: is an instrumented process scraped?")
    running = source.series(RUNNING)
    findings, judged = [], False
    for group, busy_points in busy.items():
        loaded = [(b, r) for b, r in aligned(busy_points, running.get(group, [])) if r > 0]
        if not loaded:
            continue
        judged = True
        mean_busy = statistics.fmean(b for b, _ in loaded)
        if mean_busy >= HOST_BOUND_BUSY_RATIO:
            continue
        evidence = [
            _evidence(source, "busy ratio while requests run (mean)", percent(mean_busy), BUSY),
            _evidence(
                source,
                "requests running (mean of those steps)",
                number(statistics.fmean(r for _, r in loaded)),
                RUNNING,
            ),
        ]
        evidence.extend(_process_cpu_evidence(source, dict(group).get("instance", "")))
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


def _process_cpu_evidence(source: Source, instance: str) -> list[Evidence]:
    """The busiest serving process the exporter watches on the same host: a Python loop that holds one
    core near 100 % is the host-bound signature on a GPU machine."""
    host = instance.rsplit(":", 1)[0]
    cpu = {
        group: statistics.fmean(values(points))
        for group, points in source.series(PROCESS_CPU_RATE).items()
        if dict(group).get("instance", "").rsplit(":", 1)[0] == host
    }
    if not cpu:
        return []
    busiest = max(cpu, key=cpu.__getitem__)
    labels = dict(busiest)
    return [
        _evidence(
            source,
            f"CPU of the busiest serving process on the host, {labels.get('comm')} ({labels.get('pid')})",
            f"{cpu[busiest]:.2f} cores",
            PROCESS_CPU_RATE,
        )
    ]


def check_throttling(source: Source) -> list[Finding]:
    active, duty = source.series(CLOCK_EVENT_ACTIVE), source.series(CLOCK_EVENT_DUTY)
    if not (active or duty):
        raise NotAssessed("no gpu_clocks_event_* series in the window: is inferwatch-exporter scraped?")
    clock_share, utilization = source.series(SM_CLOCK_SHARE), source.series(GPU_UTIL)
    reasons_by_gpu: dict[Labels, list[Evidence]] = {}
    names_by_gpu: dict[Labels, list[str]] = {}
    for group in sorted(set(active) | set(duty)):
        reason = dict(group).get("reason", "")
        if reason in BENIGN_CLOCK_REASONS:
            continue
        # The 0/1 gauge samples the moment of each poll; the violation counter misses no episode.
        share = (
            statistics.fmean(1.0 if v > 0 else 0.0 for v in values(active[group])) if group in active else 0.0
        )
        throttled = statistics.fmean(values(duty[group])) if group in duty else 0.0
        if share == 0 and throttled <= THROTTLE_DUTY_CYCLE:
            continue
        gpu = tuple((k, v) for k, v in group if k != "reason")
        names_by_gpu.setdefault(gpu, []).append(reason)
        evidence = reasons_by_gpu.setdefault(gpu, [])
        if group in active:
            evidence.append(
                _evidence(source, f"{reason} active (share of the steps)", percent(share), CLOCK_EVENT_ACTIVE)
            )
        if group in duty:
            evidence.append(
                _evidence(
                    source,
                    f"time held back by {reason} (violation counter)",
                    percent(throttled),
                    CLOCK_EVENT_DUTY,
                )
            )
    findings = []
    for gpu, evidence in sorted(reasons_by_gpu.items()):
        hardware = any(reason.startswith("hw_") for reason in names_by_gpu[gpu])
        if gpu in clock_share:
            evidence.append(
                _evidence(
                    source,
                    "SM clock / its maximum (mean)",
                    percent(statistics.fmean(values(clock_share[gpu]))),
                    SM_CLOCK_SHARE,
                )
            )
        if gpu in utilization:
            evidence.append(
                _evidence(
                    source,
                    "GPU utilization (mean)",
                    percent(statistics.fmean(values(utilization[gpu]))),
                    GPU_UTIL,
                )
            )
        names = ", ".join(names_by_gpu[gpu])
        findings.append(
            Finding(
                "throttling",
                Severity.CRITICAL if hardware else Severity.WARNING,
                subject(gpu),
                f"clocks held down by {names}: every kernel runs slower, and latency varies",
                tuple(evidence),
                (checklist.CLOCKS,),
            )
        )
    return findings


def _fluctuation(
    source: Source, latency: Expr, latency_name: str, workload: Expr, workload_name: str
) -> tuple[list[Finding], bool]:
    findings, judged = [], False
    workload_series = source.series(workload)
    for group, points in source.series(latency).items():
        if len(points) < 3:
            continue
        load = workload_series.get(group)
        if load and len(load) >= 3 and coefficient_of_variation(values(load)) > WORKLOAD_STEADY_COV:
            continue  # a varying workload explains varying latency: not the same requests
        judged = True
        cov = coefficient_of_variation(values(points))
        if cov <= FLUCTUATION_COV:
            continue
        findings.append(
            Finding(
                "fluctuation",
                Severity.WARNING,
                subject(group),
                f"mean {latency_name} varies by {percent(cov)} (coefficient of variation) between steps of a "
                f"steady workload: more than the 30 % at which identical requests count as unstable",
                (
                    _evidence(
                        source,
                        f"mean {latency_name} per step: min / mean / max",
                        " / ".join(duration(f(values(points))) for f in (min, statistics.fmean, max)),
                        latency,
                    ),
                    _evidence(
                        source,
                        f"{workload_name} per step (coefficient of variation)",
                        percent(coefficient_of_variation(values(load))) if load else "no data",
                        workload,
                    ),
                ),
                (checklist.CLOCKS, checklist.ISOLATION),
            )
        )
    return findings, judged


def check_fluctuation(source: Source) -> list[Finding]:
    itl, itl_judged = _fluctuation(source, ITL_MEAN, "inter-token latency", BATCH_MEAN, "mean batch size")
    ttft, ttft_judged = _fluctuation(
        source, TTFT_MEAN, "time to first token", PROMPT_TOKENS_MEAN, "mean prompt tokens"
    )
    if not (itl_judged or ttft_judged):
        raise NotAssessed("fewer than 3 steps with latency data, or a workload that itself varied")
    return itl + ttft


def check_oom_risk(source: Source) -> list[Finding]:
    free_share = source.series(MEMORY_FREE_SHARE)
    ooms, retries = source.series(OOM_RATE), source.series(ALLOC_RETRY_RATE)
    headroom = source.series(KV_HEADROOM)
    if not (free_share or ooms or retries or headroom):
        raise NotAssessed("no device memory, KV-cache headroom, allocator or OOM series")
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
                    _evidence(
                        source,
                        "free / total device memory: now (lowest in window)",
                        f"{percent(now)} ({percent(min(values(points)))})",
                        MEMORY_FREE_SHARE,
                    ),
                ),
                (checklist.MEMORY,),
            )
        )
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
                    (_evidence(source, f"{what} per second (peak)", number(max(values(points))), expr),),
                    (checklist.MEMORY,),
                )
            )
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
                    _evidence(source, "KV-cache headroom (tokens, now)", number(points[-1][1]), KV_HEADROOM),
                    _evidence(
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


def _leak_in(points: Sequence[tuple[float, float]]) -> float | None:
    """Relative growth over the window when memory rises steadily, else None."""
    if len(points) < 6 or points[0][1] <= 0:
        return None
    steps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(points)]
    rising = sum(1 for step in steps if step >= 0) / len(steps)
    growth = linear_slope(points) * (points[-1][0] - points[0][0]) / points[0][1]
    return growth if growth > LEAK_GROWTH and rising >= LEAK_RISING_STEPS else None


def _load_rose(points: Sequence[tuple[float, float]] | None) -> bool:
    if not points or len(points) < 3:
        return False
    third = max(1, len(points) // 3)
    early, late = statistics.fmean(values(points[:third])), statistics.fmean(values(points[-third:]))
    return late > early * LEAK_LOAD_GROWTH


def check_leaks(source: Source) -> list[Finding]:
    serving = set(source.series(SERVING_INSTANCES))
    rss = {g: p for g, p in source.series(SERVING_RSS).items() if g in serving}
    candidates = (
        (TORCH_ALLOCATED, source.series(TORCH_ALLOCATED), "torch allocated device memory"),
        (GPU_MEMORY_USED, source.series(GPU_MEMORY_USED), "device memory used"),
        (SERVING_RSS, rss, "serving process resident memory"),
    )
    if not any(series for _, series, _ in candidates):
        raise NotAssessed("no memory series (torch allocator, NVML, or serving process)")
    # The load of the whole fleet in view: device memory of a GPU serves whichever process runs on it.
    load = source.series(TOTAL_TOKENS_RATE).get(())
    findings = []
    for expr, series, what in candidates:
        for group, points in series.items():
            growth = _leak_in(points)
            if growth is None or _load_rose(load):
                continue
            per_minute = linear_slope(points) * 60
            findings.append(
                Finding(
                    "leak",
                    Severity.WARNING,
                    subject(group),
                    f"{what} grew {percent(growth)} over the window, step after step, without more load",
                    (
                        _evidence(
                            source,
                            f"{what}: first / last point; trend",
                            f"{size(points[0][1])} / {size(points[-1][1])}; {size(per_minute)}/min",
                            expr,
                        ),
                        _evidence(
                            source,
                            "generated tokens/s (first third -> last third of the window)",
                            _thirds(load),
                            TOTAL_TOKENS_RATE,
                        ),
                    ),
                    (checklist.LEAK,),
                )
            )
    return findings


def _thirds(points: Sequence[tuple[float, float]] | None) -> str:
    if not points or len(points) < 3:
        return "no data"
    third = max(1, len(points) // 3)
    return (
        f"{statistics.fmean(values(points[:third])):.1f} -> {statistics.fmean(values(points[-third:])):.1f}"
    )


def check_bound(source: Source) -> list[Finding]:
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
                        _evidence(
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
                    (_evidence(source, "prefill FLOP/s utilization (mean)", percent(mean), FLOPS_UTIL),),
                    (checklist.BF16, checklist.SDPA),
                )
            )
    return findings


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


def check_scaling(source: Source) -> list[Finding]:
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
                        _evidence(
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


CHECKS: tuple[tuple[str, Callable[[Source], list[Finding]]], ...] = (
    ("host-bound", check_host_bound),
    ("throttling", check_throttling),
    ("fluctuation", check_fluctuation),
    ("oom-risk", check_oom_risk),
    ("leak", check_leaks),
    ("bandwidth/compute-bound", check_bound),
    ("scaling", check_scaling),
)


def diagnose(source: Source) -> Diagnosis:
    """Run every check; findings most severe first."""
    result = Diagnosis()
    for name, check in CHECKS:
        try:
            found = check(source)
        except NotAssessed as exc:
            result.not_assessed[name] = str(exc)
            continue
        if found:
            result.findings.extend(found)
        else:
            result.passed.append(name)
    result.findings.sort(key=lambda f: -f.severity)
    return result
