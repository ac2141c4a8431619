"""The metrics endpoint of a serving process whose model runs on a GPU, for machines without one.

``llm_gpu_busy_ratio`` comes from NVML in a process that serves a CUDA model: a CPU-only machine (CI) has
no such process, and the demo it can run serves a CPU model, which has no busy ratio (docs/metrics.md).
The readers of that series (the host-bound alert, ``inferwatch diagnose``, ``top``) are tested against
this endpoint instead: the real instrumentation endpoint (``start_http_server``) serving the real
catalogue's families on their own registry, with the values an instrumented process on an H200 showed in
docs/benchmarks.md ("The GPU busy ratio"): an eager decode loop the GPU runs 11 % of the time, or a
GPU-bound one it runs 95 %; one request always running, and tokens counted as they are produced. The
measurement itself is tested where it can happen, on the GPU (tests/gpu, tests/benchmarks/gpu_busy.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.device.hardware import DeviceIdentity
from inferwatch.instrumentation.endpoint.server import start_http_server
from inferwatch.instrumentation.metrics import catalogue as cat
from tests.support.fake_nvml import gpu_uuid

#: Busy ratios the H200 measured (docs/benchmarks.md): eager batch-1 decode of a 1B model; a GPU-bound load.
HOST_BOUND_BUSY = 0.11
GPU_BOUND_BUSY = 0.95
#: The share of wall time inside the forward passes of that eager loop: the host launching kernels.
HOST_BOUND_FORWARD_TIME = 0.9
DEVICE = "cuda:0"
TOKENS_PER_SECOND = 60.0


@dataclass
class GpuServing:
    """A running endpoint; :meth:`set_busy` changes what the GPU is said to do."""

    address: str  # host:port
    model: str
    device: DeviceIdentity
    registry: CollectorRegistry
    metrics: cat.Metrics
    _stop: threading.Event = field(default_factory=threading.Event)

    def set_busy(self, ratio: float, forward_time: float) -> None:
        self.metrics[cat.GPU_BUSY].labels(self.model, *self.device.labels, "process").set(ratio)
        self.metrics[cat.FORWARD_TIME_RATIO].labels(self.model, *self.device.labels).set(forward_time)

    def _produce(self) -> None:
        tokens = self.metrics[cat.GENERATION_TOKENS].labels(self.model)
        while not self._stop.wait(0.1):
            tokens.inc(TOKENS_PER_SECOND * 0.1)


@contextmanager
def gpu_serving(model: str, gpu: int = 0) -> Iterator[GpuServing]:
    """An endpoint on loopback serving ``model`` on its ``cuda:0``, host-bound, with one request running.
    That device is the NVML stand-in's GPU ``gpu`` (tests/support/fake_nvml.py), by its UUID: as a
    process given one GPU by CUDA_VISIBLE_DEVICES or a Kubernetes device plugin sees it."""
    registry = CollectorRegistry()
    metrics = cat.Metrics(registry, InstrumentConfig())
    device = DeviceIdentity(DEVICE, gpu_uuid(gpu))
    metrics[cat.MODEL_INFO].labels(model, "llama", "bfloat16", *device.labels, "1235814400").set(1)
    metrics[cat.REQUESTS_RUNNING].labels(model).set(1)
    server = start_http_server(port=0, registry=registry)
    serving = GpuServing(f"127.0.0.1:{server.port}", model, device, registry, metrics)
    serving.set_busy(HOST_BOUND_BUSY, HOST_BOUND_FORWARD_TIME)
    producer = threading.Thread(target=serving._produce, name="gpu-serving-tokens", daemon=True)
    producer.start()
    try:
        yield serving
    finally:
        serving._stop.set()
        producer.join()
        server.close()
