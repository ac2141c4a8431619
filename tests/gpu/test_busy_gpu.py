"""The GPU busy ratio on a real GPU and the real NVML, from a process in a PID namespace of its own.

A container's processes have PIDs of their own namespace while NVML reports the host's. The serving
process here runs under ``unshare --pid --fork --mount-proc`` (its PID there is 1, NVML knows it by
another): alone on the GPU it is still measured, by the GPU's own utilization (``source="device"``); with
a second process holding a context on the GPU (this one), it cannot tell which of NVML's PIDs is its own
and says so (``llm_gpu_busy_unavailable{reason="process_ambiguous"}``) instead of reporting a figure that
counts the neighbour's kernels. Run first in tests/gpu (its file name sorts first) so that, at its start,
this process has no CUDA context yet. Run: ``python -m pytest tests/gpu/test_busy_gpu.py -v``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from tests.support import parse_samples

pytestmark = pytest.mark.gpu

# A serving process that generates for a few seconds with 0.2 s polls, then prints its exposition.
SERVING = """
import time
import torch
from inferwatch.instrumentation import InstrumentConfig, instrument
from inferwatch.instrumentation.models import build_model
from prometheus_client import CollectorRegistry, generate_latest

registry = CollectorRegistry()
model = build_model("tiny-llama", device="cuda")
instrument(model, model_name="m", registry=registry, config=InstrumentConfig(poll_interval_seconds=0.2))
ids = torch.ones((1, 8), dtype=torch.long, device="cuda")
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
print(generate_latest(registry).decode())
"""


def serve_in_own_pid_namespace() -> list:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) on this machine")
    command = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", SERVING]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"no PID namespaces here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-3000:]
    return parse_samples(result.stdout)


def test_a_serving_process_in_its_own_pid_namespace() -> None:
    if not torch.cuda.is_initialized():
        alone = serve_in_own_pid_namespace()
        busy = [s for s in alone if s.name == "llm_gpu_busy_ratio"]
        assert [s.labels["source"] for s in busy] == ["device"], alone
        assert 0 < busy[0].value <= 1
        assert not [s for s in alone if s.name == "llm_gpu_busy_unavailable"]
    torch.ones(1, device="cuda")  # this process now holds a context on the GPU too
    shared = serve_in_own_pid_namespace()
    assert not [s for s in shared if s.name == "llm_gpu_busy_ratio"]
    reasons = [s.labels["reason"] for s in shared if s.name == "llm_gpu_busy_unavailable" and s.value == 1]
    assert reasons == ["process_ambiguous"]


def test_nvml_switched_off_says_so() -> None:
    from inferwatch.instrumentation import InstrumentConfig, instrument
    from inferwatch.instrumentation.models import build_model
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    model = build_model("tiny-llama", device="cuda")
    handle = instrument(model, model_name="m", registry=registry, config=InstrumentConfig(enable_nvml=False))
    try:
        samples = parse_samples(generate_latest(registry).decode())
    finally:
        handle.remove()
    reasons = [s.labels["reason"] for s in samples if s.name == "llm_gpu_busy_unavailable"]
    assert reasons == ["nvml_disabled"]
    assert not [s for s in samples if s.name == "llm_gpu_busy_ratio"]
