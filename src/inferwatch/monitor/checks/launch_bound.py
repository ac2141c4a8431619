"""Launch-bound: kernels run much of the time, by NVML's utilization or by the model's busy ratio, yet few
of the SMs are active (NVML GPM): each step is a stream of kernels too small to fill the GPU, and the
GPU waits on their launches (reference/002 §4.1: CUDA kernel launch latency, SM utilization). Measured on
an H200: a host-driven loop of 128² matmuls read 17-25 % NVML utilization with 2 % of the SMs active,
where a bf16 8192² matmul loop read 100 % and 96 %.

No alert watches this (the exporter's GPM series exist only on Hopper and newer GPUs): the thresholds
are the check's own, below.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from inferwatch.common import names

from .. import checklist
from ..queries import BUSY_BY_GPU, GPU_UTIL, SM_ACTIVE
from ..units import percent
from .attribution import serving_on
from .findings import Finding, Severity, Source, evidence_for, gpm_series, subject
from .stats import values
from .thresholds import Thresholds

#: Kernels run at least this share of the time (NVML utilization or a model's busy ratio) ...
BUSY_ABOVE = 0.1
#: ... while the SMs are active less than this fraction of it: three quarters of the "busy" time, the
#: SMs idle. Between the two measured cases above (0.02 / 0.2 and 0.96 / 1.0) by a wide margin.
SM_SHARE_BELOW = 0.25


def is_launch_bound(kernels: float, sm_active: float) -> bool:
    """Whether kernels running ``kernels`` of the time with ``sm_active`` of the SMs active is the
    launch-bound pattern (``inferwatch top`` marks it too)."""
    return kernels >= BUSY_ABOVE and sm_active < kernels * SM_SHARE_BELOW


def check_launch_bound(source: Source, limits: Thresholds) -> list[Finding]:
    sm_active = gpm_series(source, SM_ACTIVE, names.GPU_SM_ACTIVE_RATIO)
    utilization = source.series(GPU_UTIL)
    model_busy = _busy_by_gpu(source)
    serving = serving_on(source)
    findings = []
    for gpu, points in sorted(sm_active.items()):
        uuid = dict(gpu).get("uuid", "")
        sm = statistics.fmean(values(points))
        nvml = statistics.fmean(values(utilization[gpu])) if gpu in utilization else None
        model = model_busy.get(uuid)
        kernels = max((v for v in (nvml, model) if v is not None), default=None)
        if kernels is None or not is_launch_bound(kernels, sm):
            continue
        evidence = [evidence_for(source, "SM active (GPM, mean)", percent(sm), SM_ACTIVE)]
        if nvml is not None:
            evidence.append(evidence_for(source, "NVML utilization (mean)", percent(nvml), GPU_UTIL))
        if model is not None:
            what = "busy ratio of the serving processes on this GPU (mean, summed)"
            evidence.append(evidence_for(source, what, percent(model), BUSY_BY_GPU))
        findings.append(
            Finding(
                "launch-bound",
                Severity.WARNING,
                subject(gpu),
                f"kernels run {percent(kernels)} of the time but only {percent(sm)} of the SMs are active: "
                "the steps are streams of tiny kernels, and the GPU waits on their launches" + serving(gpu),
                tuple(evidence),
                (checklist.COMPILE, checklist.CUDA_GRAPHS, checklist.BATCHING),
            )
        )
    return findings


def _busy_by_gpu(source: Source) -> dict[str, float]:
    """GPU UUID -> the busy ratios of the serving processes on it, each its mean over the window, summed:
    each process's share of one GPU's time."""
    out: defaultdict[str, float] = defaultdict(float)
    for group, points in source.series(BUSY_BY_GPU).items():
        uuid = dict(group).get("uuid", "")
        if uuid:
            out[uuid] += statistics.fmean(values(points))
    return dict(out)
