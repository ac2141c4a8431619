"""The background side: utilization windows, KV headroom, NVML faults."""

from __future__ import annotations

import time

import pynvml
import pytest
import torch

from inferwatch.instrumentation import InstrumentConfig
from inferwatch.instrumentation.device.hardware import DeviceIdentity, parameter_footprint
from inferwatch.instrumentation.device.nvml_poller import NvmlPoller
from inferwatch.instrumentation.device.pollers import ModelPoller
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from tests.unit.instrumentation.conftest import batch_of, metric, scrape

pytestmark = pytest.mark.matrix

GPU_UUID = "GPU-00000000-0000-0000-0000-000000000000"


def test_model_poller_turns_a_window_into_ratios(registry) -> None:
    series = series_for(metrics_for(registry, InstrumentConfig()), "m")
    poller = ModelPoller(
        series, torch.device("cpu"), DeviceIdentity("cpu"), 1.0, peak_flops=1e12, peak_bandwidth=lambda: 1e11
    )
    series.add_forwards(
        "cpu", "prefill", [0.002], read_bytes=0.0, flops=1e9
    )  # 1 GFLOP in 2 ms: 0.5 of 1 TFLOP/s
    series.add_forwards("cpu", "decode", [0.001], read_bytes=2e7, flops=0.0)  # 20 MB in 1 ms
    series.add_forwards(
        "cpu", "decode", [0.003], read_bytes=6e7, flops=0.0
    )  # 60 MB in 3 ms: 20 GB/s: 0.2 of 100 GB/s
    time.sleep(0.01)
    poller.poll()
    assert metric(registry, "llm_prefill_flops_utilization_ratio", model="m", device="cpu") == pytest.approx(
        0.5
    )
    assert metric(
        registry, "llm_decode_bandwidth_utilization_ratio", model="m", device="cpu"
    ) == pytest.approx(0.2)
    forward_time = metric(registry, "llm_forward_time_ratio", model="m", device="cpu")
    assert 0 < forward_time < 0.006 / 0.01
    poller.poll()  # an idle window: forward time drops, the last known utilizations stay
    assert metric(registry, "llm_forward_time_ratio", model="m", device="cpu") == 0
    assert metric(registry, "llm_prefill_flops_utilization_ratio", model="m", device="cpu") == pytest.approx(
        0.5
    )


def test_unknown_peaks_leave_the_ratios_absent(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m", config=InstrumentConfig(poll_interval_seconds=0.05))
    ids, mask = batch_of("no peaks on a CPU")
    llama.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert handle.flush()
    deadline = time.monotonic() + 10
    headroom = None
    while time.monotonic() < deadline and not headroom:
        time.sleep(0.02)
        headroom = metric(registry, "llm_kv_cache_headroom_tokens", model="m")
    per_token = metric(registry, "llm_kv_cache_bytes_per_token", model="m")
    assert headroom and per_token and headroom * per_token > 1e6  # host memory available, in tokens
    assert metric(registry, "llm_forward_time_ratio", model="m", device="cpu") is not None
    text = scrape(registry)
    # No GPU, no GPU busy ratio: not a stand-in figure, not a reason series either.
    assert "llm_gpu_busy_ratio{" not in text and "llm_gpu_busy_unavailable{" not in text
    assert "llm_decode_bandwidth_utilization_ratio{" not in text
    assert "llm_prefill_flops_utilization_ratio{" not in text
    assert "llm_nvml_" not in text.replace("# HELP llm_nvml_", "").replace("# TYPE llm_nvml_", "")


def test_forward_time_ratio_sees_the_forwards(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m", config=InstrumentConfig(poll_interval_seconds=0.1))
    ids, mask = batch_of("busy")
    deadline = time.monotonic() + 10
    forward_time = 0.0
    while time.monotonic() < deadline and not forward_time:
        llama.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        forward_time = metric(registry, "llm_forward_time_ratio", model="m", device="cpu") or 0.0
    assert handle.flush()
    assert 0 < forward_time <= 1


class FaultyNvml:
    """NVML fault injection: the real pynvml error types, raised by init or by every reading."""

    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    def __init__(self, init_error: int | None = None, read_error: int | None = None) -> None:
        self.init_error, self.read_error, self.reads = init_error, read_error, 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def _read(self) -> None:
        self.reads += 1
        raise pynvml.NVMLError(self.read_error)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> None:
        self._read()

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> None:
        self._read()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> None:
        self._read()

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> None:
        self._read()

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> None:
        self._read()


def _poller(registry, nvml: FaultyNvml) -> NvmlPoller:
    metrics = metrics_for(registry, InstrumentConfig())
    return NvmlPoller(metrics, DeviceIdentity("cuda:0", GPU_UUID), 0, 1.0, nvml=nvml)


def test_nvml_absent_switches_the_poller_off_quietly(registry) -> None:
    nvml = FaultyNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    poller = _poller(registry, nvml)
    poller.poll()
    poller.poll()
    assert nvml.reads == 0
    assert metric(registry, "llm_instrumentation_errors_total") is None
    assert metric(registry, "llm_nvml_gpu_utilization_ratio") is None


def test_nvml_read_faults_are_counted_and_retried(registry) -> None:
    nvml = FaultyNvml(read_error=pynvml.NVML_ERROR_GPU_IS_LOST)
    poller = _poller(registry, nvml)
    poller.poll()
    poller.poll()
    assert nvml.reads == 2 * 4  # every reading retried at the next poll
    assert metric(registry, "llm_instrumentation_errors_total", stage="nvml") == 8
    assert metric(registry, "llm_nvml_gpu_utilization_ratio") is None


def test_unsupported_nvml_readings_are_skipped_for_good(registry) -> None:
    nvml = FaultyNvml(read_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    poller = _poller(registry, nvml)
    poller.poll()
    poller.poll()
    assert nvml.reads == 4  # tried once each, then skipped
    assert metric(registry, "llm_instrumentation_errors_total") is None


def test_footprint_counts_what_a_step_really_touches(llama, gpt2) -> None:
    total = sum(p.numel() for p in llama.parameters())
    table = llama.config.vocab_size * llama.config.hidden_size
    footprint = parameter_footprint(llama)  # separate embedding and output tables
    assert (footprint.count, footprint.matmul_count) == (total, total - 2 * table)
    assert footprint.decode_read_bytes == (total - table) * 4
    total = sum(p.numel() for p in gpt2.parameters())
    table = gpt2.config.vocab_size * gpt2.config.n_embd
    footprint = parameter_footprint(gpt2)  # one table, tied: read in full by the output projection
    assert (footprint.count, footprint.matmul_count) == (total, total - table)
    assert footprint.decode_read_bytes == total * 4


class _Waiting:
    """A pending item that resolves once ``done`` is set."""

    def __init__(self) -> None:
        self.done = False

    def resolve(self) -> bool:
        return self.done

    def expired(self) -> bool:
        return False


def test_a_flush_waits_for_its_own_models_items_only(llama, gpt2, registry, instrumented) -> None:
    busy, idle = instrumented(llama, model_name="busy"), instrumented(gpt2, model_name="idle")
    item = _Waiting()
    busy._instrumentation.model.background.defer(item, busy._instrumentation.model.errors)
    assert idle.flush(timeout=0.2), "another model's pending item held this model's flush"
    assert not busy.flush(timeout=0.2)
    item.done = True
    assert busy.flush(timeout=5)
