"""Host-bound: the GPU runs the serving process's kernels for less of the wall time while requests run
than the InferwatchHostBound alert allows (reference/002 §4.1: idle gaps in the timeline). The busy ratio is
the driver's (``llm_gpu_busy_ratio``, NVML), never the spans of the forward passes, which on a host-bound
step last as long as the host takes to launch their kernels: the forwards' share of the wall time and the
CPU of the busiest process on the model's GPU (the exporter's, joined by the GPU's UUID) are the evidence
of where the time goes instead.

A model on the CPU has no busy ratio (its device is the host); a GPU whose share NVML cannot tell for this
process has none either, and ``llm_gpu_busy_unavailable`` says why: the check names the reason rather than
judge from a figure that reads high.
"""

from __future__ import annotations

import statistics

from inferwatch.common import names

from .. import checklist
from ..queries import (
    BUSY,
    BUSY_UNAVAILABLE,
    FORWARD_TIME,
    GPU_PROCESS_MEMORY,
    GRAPHICS_ACTIVE,
    MODEL_GPUS,
    PROCESS_CPU_RATE,
    RUNNING,
)
from ..units import number, percent
from .attribution import model_gpus
from .findings import Evidence, Finding, NotAssessed, Severity, Source, evidence_for, subject
from .stats import aligned, values
from .thresholds import Thresholds


def check_host_bound(source: Source, limits: Thresholds) -> list[Finding]:
    busy = source.series(BUSY)
    if not busy:
        raise NotAssessed(_why_no_busy_ratio(source))
    running, forward_time = source.series(RUNNING), source.series(FORWARD_TIME)
    gpus = model_gpus(source.series(MODEL_GPUS))
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
        if group in forward_time:
            spans = statistics.fmean(values(forward_time[group]))
            what = "wall time inside forward passes (mean; launching kernels counts)"
            evidence.append(evidence_for(source, what, percent(spans), FORWARD_TIME))
        evidence.extend(_graphics_evidence(source, gpus.get(group, "")))
        evidence.extend(_process_cpu_evidence(source, gpus.get(group, "")))
        findings.append(
            Finding(
                "host-bound",
                Severity.WARNING,
                subject(group),
                f"the GPU runs the model's kernels only {percent(mean_busy)} of the wall time while "
                f"requests run: the serving loop on the host, not the device, sets the pace",
                tuple(evidence),
                (checklist.OVERLAP, checklist.COMPILE, checklist.BATCHING),
            )
        )
    if not judged:
        raise NotAssessed("no requests ran while the busy ratio was measured")
    return findings


def _why_no_busy_ratio(source: Source) -> str:
    """Why there is no busy ratio to judge: the reasons the instrumentation gave, else the likely cause."""
    reasons = sorted({dict(group).get("reason", "") for group in source.series(BUSY_UNAVAILABLE)})
    if reasons:
        return (
            f"no {names.LLM_GPU_BUSY_RATIO}: NVML cannot measure the serving process's share of its GPU "
            f"({names.LLM_GPU_BUSY_UNAVAILABLE}: {', '.join(reasons)})"
        )
    return (
        f"no {names.LLM_GPU_BUSY_RATIO} in the window: no instrumented process on a GPU is scraped (a model "
        "on the CPU has none)"
    )


def _graphics_evidence(source: Source, uuid: str) -> list[Evidence]:
    """The exporter's graphics-engine activity of the model's whole GPU (GPM): the time any process's
    kernels ran, which a busy ratio from the process's own share cannot show."""
    found = [
        points
        for group, points in source.series(GRAPHICS_ACTIVE).items()
        if uuid and dict(group).get("uuid") == uuid
    ]
    if not found:
        return []
    what = "graphics engine active on the model's GPU (GPM, every process's kernels; mean)"
    return [evidence_for(source, what, percent(statistics.fmean(values(found[0]))), GRAPHICS_ACTIVE)]


def _process_cpu_evidence(source: Source, uuid: str) -> list[Evidence]:
    """The busiest of the processes the exporter sees on the model's GPU: a Python loop that holds one
    core near 100 % is the host-bound signature on a GPU machine."""
    on_gpu = {
        (labels.get("instance"), labels.get("pid"))
        for labels in map(dict, source.series(GPU_PROCESS_MEMORY))
        if uuid and labels.get("uuid") == uuid
    }
    cpu = {
        group: statistics.fmean(values(points))
        for group, points in source.series(PROCESS_CPU_RATE).items()
        if (dict(group).get("instance"), dict(group).get("pid")) in on_gpu
    }
    if not cpu:
        return []
    busiest = max(cpu, key=cpu.__getitem__)
    labels = dict(busiest)
    return [
        evidence_for(
            source,
            f"CPU of the busiest process on the model's GPU, {labels.get('comm')} ({labels.get('pid')})",
            f"{cpu[busiest]:.2f} cores",
            PROCESS_CPU_RATE,
        )
    ]
