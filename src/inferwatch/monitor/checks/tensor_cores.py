"""Tensor cores idle (a hint, not an alarm): the SMs are busy but the tensor cores are not (NVML GPM). An
LLM's work is matmuls; run in FP32 (TF32 off) they never reach the tensor cores and run several times
slower (reference/000's checklist: BF16, ~2x from the tensor cores). On an H200 a bf16 8192² matmul loop
kept the tensor cores 93 % active with 96 % of the SMs active.

No alert watches this: the thresholds are the check's own, below.
"""

from __future__ import annotations

import statistics

from inferwatch.common import names

from .. import checklist
from ..queries import FP32_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE
from ..units import percent
from .attribution import serving_on
from .findings import Finding, Severity, Source, evidence_for, gpm_series, subject
from .stats import values
from .thresholds import Thresholds

#: The SMs are busy: at least this share of them active ...
SM_ACTIVE_ABOVE = 0.5
#: ... while the tensor cores work less than this share of the time.
TENSOR_ACTIVE_BELOW = 0.05


def check_tensor_cores(source: Source, limits: Thresholds) -> list[Finding]:
    tensor = gpm_series(source, TENSOR_ACTIVE, names.GPU_TENSOR_ACTIVE_RATIO)
    sm_active, fp32 = source.series(SM_ACTIVE), source.series(FP32_ACTIVE)
    serving = serving_on(source)
    findings = []
    for gpu, points in sorted(tensor.items()):
        tensor_mean = statistics.fmean(values(points))
        if gpu not in sm_active:
            continue
        sm = statistics.fmean(values(sm_active[gpu]))
        if sm < SM_ACTIVE_ABOVE or tensor_mean >= TENSOR_ACTIVE_BELOW:
            continue
        evidence = [
            evidence_for(source, "SM active (GPM, mean)", percent(sm), SM_ACTIVE),
            evidence_for(source, "tensor cores active (GPM, mean)", percent(tensor_mean), TENSOR_ACTIVE),
        ]
        if gpu in fp32:
            what = "FP32 math outside the tensor cores (GPM, mean)"
            evidence.append(
                evidence_for(source, what, percent(statistics.fmean(values(fp32[gpu]))), FP32_ACTIVE)
            )
        findings.append(
            Finding(
                "tensor-cores-idle",
                Severity.INFO,
                subject(gpu),
                f"{percent(sm)} of the SMs are active but the tensor cores only {percent(tensor_mean)} "
                "of the time: if that work is matmuls, they run in FP32 without tensor cores" + serving(gpu),
                tuple(evidence),
                (checklist.BF16,),
            )
        )
    return findings
