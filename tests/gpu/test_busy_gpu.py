"""The GPU busy ratio on a real GPU and the real NVML, from a process in a PID namespace of its own.

A container's processes have PIDs of their own namespace. The serving process here runs under
``unshare --pid --fork --mount-proc`` (its PID there is 1) while this process, outside its namespace, keeps
the GPU busy with a bf16 matmul loop. The driver lists the serving process alone there (as PID 1): the
GPU's own utilization, nearly 100 %, would be the neighbour's, so the busy ratio must be the serving
process's own share (``source="process"``): above 0, since it decodes, and far below the GPU's. Run:
``python -m pytest tests/gpu/test_busy_gpu.py -v``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.support import parse_samples

pytestmark = pytest.mark.gpu

# A serving process that decodes for a few seconds with 1 s polls, then prints its exposition as it was
# while it decoded, at its highest busy ratio, and on stderr what NVML showed it, for a failure's message.
# Beside the neighbour's matmuls its kernels get a few percent of the GPU, and NVML's per-process share is
# a whole percent: a poll window much shorter than a second often reads 0 (measured on the H200: 0.2 s
# polls read 0 while NVML's share since the start was 2 %); a poll after the loop has no kernels at all.
SERVING = """
import sys, time
import pynvml, torch
from inferwatch.instrumentation import InstrumentConfig, instrument
from inferwatch.instrumentation.demo.models import build_model
from prometheus_client import CollectorRegistry, generate_latest

registry = CollectorRegistry()
model = build_model("tiny-llama", device="cuda")
UUID = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
instrument(model, model_name="m", registry=registry, config=InstrumentConfig(poll_interval_seconds=1.0))
ids = torch.ones((1, 8), dtype=torch.long, device="cuda")
deadline = time.monotonic() + 8
highest, decoding = -1.0, ""
while time.monotonic() < deadline:
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    busy = registry.get_sample_value("llm_gpu_busy_ratio", {"model": "m", "device": "cuda:0", "uuid": UUID,
                                                            "mig_uuid": "", "source": "process"})
    if busy is not None and busy > highest:
        highest, decoding = busy, generate_latest(registry).decode()
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
shares = [(s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, 0)]
print(f"listed {listed}, per-process shares {shares}", file=sys.stderr)
print(decoding)
"""


def test_a_serving_process_in_its_own_pid_namespace_beside_a_busy_one() -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) on this machine")
    stop = threading.Event()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def neighbour() -> None:
        while not stop.is_set():
            for _ in range(8):
                a @ a
            torch.cuda.synchronize()

    busy_loop = threading.Thread(target=neighbour)
    busy_loop.start()
    try:
        command = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", SERVING]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    finally:
        stop.set()
        busy_loop.join()
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"no PID namespaces here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-3000:]
    samples = parse_samples(result.stdout)
    busy = [s for s in samples if s.name == "llm_gpu_busy_ratio"]
    nvml = result.stderr.strip().splitlines()[-1]
    assert [s.labels["source"] for s in busy] == ["process"], (samples, nvml)
    assert 0 < busy[0].value < 0.5, (busy, nvml)


def test_nvml_switched_off_says_so() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from inferwatch.instrumentation import InstrumentConfig, instrument
    from inferwatch.instrumentation.demo.models import build_model

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


def test_alone_on_a_gpu_with_gpm_the_busy_ratio_is_the_graphics_engines() -> None:
    import pynvml
    from prometheus_client import CollectorRegistry

    from inferwatch.instrumentation import InstrumentConfig, instrument
    from inferwatch.instrumentation.demo.models import build_model

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
        pytest.skip("this GPU has no GPM (before Hopper)")
    if len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) > 1:
        pytest.skip("another process is on the GPU: its figure is not this process's")
    registry = CollectorRegistry()
    model = build_model("tiny-llama", device="cuda")
    config = InstrumentConfig(poll_interval_seconds=0.5)
    instrumented = instrument(model, model_name="m", registry=registry, config=config)
    ids = torch.ones((1, 8), dtype=torch.long, device="cuda")
    sources: set[str] = set()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
            for family in registry.collect():
                for sample in family.samples:
                    if sample.name == "llm_gpu_busy_ratio":
                        sources.add(sample.labels["source"])
                        assert 0 <= sample.value <= 1, sample
    finally:
        instrumented.remove()
    assert sources == {"graphics"}
