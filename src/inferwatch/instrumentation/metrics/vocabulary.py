"""The words of the catalogue's labels: each a ``Literal`` type, so that a type checker catches a phase,
status or reason that is not one of them, and the tuple of its values for code that iterates them
(live-series removal, docs checks). Names here are what users query; changing one is a breaking change.
"""

from __future__ import annotations

from typing import Literal, get_args

#: ``llm_forward_seconds{phase}``: a prompt's forward, a decode step's, or a continuous-batching step that
#: carries both. Per-request phases (prefill and decode time) use the first two only.
ForwardPhase = Literal["prefill", "decode", "mixed"]
Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = get_args(Phase)

#: ``llm_requests_total{status}``: the four a model's request ends with, then the two of a request the
#: server answered before any model ran (the HTTP edge's middleware): a client mistake, a server failure.
Status = Literal["ok", "error", "oom", "cancelled", "rejected", "server_error"]
STATUSES: tuple[Status, ...] = get_args(Status)

#: ``llm_requests_finished_total{finish_reason}``: why a request a model ran ended (the OpenAI API's words).
FinishReason = Literal["stop", "length", "cancelled", "error", "oom"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)

#: ``llm_step_tokens{kind}``.
StepTokenKind = Literal["prefill", "decode"]
STEP_TOKEN_KINDS: tuple[StepTokenKind, ...] = get_args(StepTokenKind)

#: ``llm_kv_cache_blocks{state}``.
KVBlockState = Literal["used", "prefix_cached", "total"]
KV_BLOCK_STATES: tuple[KVBlockState, ...] = get_args(KVBlockState)

#: ``llm_gpu_busy_ratio{source}``: this process's kernels (NVML's per-process samples), or, where the process
#: is its GPU's only compute process, the GPU's graphics-engine activity (GPM) or its utilization.
BusySource = Literal["process", "device", "graphics"]
SOURCE_PROCESS: BusySource = "process"
SOURCE_DEVICE: BusySource = "device"
SOURCE_GRAPHICS: BusySource = "graphics"
BUSY_SOURCES: tuple[BusySource, ...] = get_args(BusySource)

#: ``llm_gpu_busy_unavailable{reason}``.
BusyUnavailable = Literal[
    "nvml_disabled", "nvml_unavailable", "not_supported", "process_not_visible", "process_ambiguous"
]
NVML_DISABLED: BusyUnavailable = "nvml_disabled"
NVML_UNAVAILABLE: BusyUnavailable = "nvml_unavailable"
NOT_SUPPORTED: BusyUnavailable = "not_supported"
PROCESS_NOT_VISIBLE: BusyUnavailable = "process_not_visible"
PROCESS_AMBIGUOUS: BusyUnavailable = "process_ambiguous"

#: ``llm_e2e_request_latency_seconds{outcome}``: a served request's latency to its end, and a cancelled
#: one's to when its client went away (the two statuses a request ends with having run for its client).
Outcome = Literal["ok", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
