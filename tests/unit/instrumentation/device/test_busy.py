"""Whose kernels the GPU ran: the busy ratio's source, and its paths that no GPU of the CI machine has.

On a GPU (tests/gpu, tests/benchmarks/gpu_busy.py) the same code reads the real NVML. What cannot happen
there is stood in for here, in the shapes the H200 answered (docs/benchmarks.md, "The GPU busy ratio"): a
container's PID namespace (NVML lists host PIDs), a GPU shared with other processes, a driver that hides
processes, utilization readings a GPU does not support, a failing call. NVML answers per-process
utilization as one sample per process, its share of the time since the timestamp asked for; the GPU's own
utilization as samples every 200 ms, idle ones included.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pynvml
import pytest
import torch

from inferwatch.instrumentation import InstrumentConfig
from inferwatch.instrumentation.device import busy
from inferwatch.instrumentation.device.hardware import DeviceIdentity
from inferwatch.instrumentation.device.nvml_poller import NvmlPoller
from inferwatch.instrumentation.device.pollers import ModelPoller
from inferwatch.instrumentation.metrics import vocabulary
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from tests.unit.instrumentation.conftest import metric, scrape

PID = os.getpid()
GPU_UUID = "GPU-00000000-0000-0000-0000-000000000000"
HOST_PID = 90210  # this process as a driver outside its PID namespace knows it


class Nvml:
    """NVML of one GPU whose compute processes, per-process shares and utilization samples the test
    sets; a reading it does not support raises the real pynvml error, as the driver does."""

    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    def __init__(self) -> None:
        self.processes: list[int] = [PID]
        self.process_shares: dict[int, int] = {}  # pid -> percent since the timestamp asked for
        self.device_samples: list[int] = []  # percent, one per 200 ms, appended as time passes
        self.now_us = 1_000_000
        self.unsupported: set[str] = set()
        self.failing: set[str] = set()
        self.asked_since: list[int] = []
        self.sample_lag_us: dict[int, int] = {}  # pid -> how much older than the last period its sample is
        self.during_call: list[object] = []  # what `watch()` returned inside each per-process call
        self.watch = lambda: None

    def clock(self) -> float:
        """The monotonic clock of the driver's samples, in seconds."""
        return self.now_us / 1e6

    def advance(self, *percents: int) -> None:
        """200 ms of GPU samples pass, one per value."""
        for percent in percents:
            self.now_us += 200_000
            self.device_samples.append((self.now_us, percent))

    def _check(self, call: str) -> None:
        if call in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if call in self.failing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=50, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=1 << 30, total=1 << 34)

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> int:
        return 6144

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        return 2619

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        self._check("processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=(1 + i) << 30) for i, pid in enumerate(self.processes)]

    def nvmlDeviceGetSamples(self, handle: str, sample_type: int, last_seen_us: int) -> tuple[int, list]:
        self._check("samples")
        fresh = [(t, v) for t, v in self.device_samples if t > last_seen_us]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in fresh]

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_seen_us: int) -> list[SimpleNamespace]:
        self._check("process_utilization")
        self.asked_since.append(last_seen_us)
        self.during_call.append(self.watch())
        stamp = self.now_us - 170_000  # the driver's last sample, a little before the call
        found = [
            SimpleNamespace(pid=pid, timeStamp=stamp - self.sample_lag_us.get(pid, 0), smUtil=share)
            for pid, share in self.process_shares.items()
        ]
        return [s for s in found if s.timeStamp > last_seen_us]


@pytest.mark.parametrize(
    ("listed", "mine", "why"),
    [
        ({HOST_PID}, {HOST_PID}, None),  # the only process, under its host PID: this one
        ({PID, 7, 8}, {PID}, None),  # several, one under this process's PID
        ({7, 8}, set(), vocabulary.PROCESS_AMBIGUOUS),  # several under other PIDs: which is this one?
        (set(), set(), vocabulary.PROCESS_NOT_VISIBLE),  # the driver shows this container no process
    ],
)
def test_which_process_is_this_one(listed: set[int], mine: set[int], why: str | None) -> None:
    assert busy.identify(listed, frozenset({PID})) == (mine, why)


def test_own_pids_include_every_pid_namespace(tmp_path) -> None:
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nPid:\t{PID}\nNSpid:\t{HOST_PID}\t{PID}\n")
    assert busy.own_pids(str(status)) == {PID, HOST_PID}
    assert busy.own_pids(str(tmp_path / "missing")) == {PID}


def test_the_only_process_reads_the_gpus_own_utilization_window_by_window() -> None:
    nvml = Nvml()
    nvml.processes = [HOST_PID]  # in a PID namespace: NVML knows this process by another PID
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}))
    nvml.advance(10, 20, 30, 40, 0)
    assert meter.read({HOST_PID}) == busy.BusyReading(pytest.approx(0.2), vocabulary.SOURCE_DEVICE)
    nvml.advance(100, 100)  # only the samples since the last poll count
    assert meter.read({HOST_PID}) == busy.BusyReading(pytest.approx(1.0), vocabulary.SOURCE_DEVICE)
    assert meter.read({HOST_PID}) == busy.BusyReading(
        pytest.approx(1.0), vocabulary.SOURCE_DEVICE
    )  # none new


def test_a_shared_gpu_reads_this_processs_own_share_since_the_last_poll() -> None:
    nvml = Nvml()
    nvml.processes = [7, PID]
    nvml.process_shares = {7: 90, PID: 15}
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}))
    nvml.advance(95)
    assert meter.read({7, PID}) == busy.BusyReading(pytest.approx(0.15), vocabulary.SOURCE_PROCESS)
    nvml.advance(95)
    nvml.process_shares = {7: 90}  # this process ran nothing since: NVML lists the others only
    assert meter.read({7, PID}) == busy.BusyReading(0.0, vocabulary.SOURCE_PROCESS)
    # Each poll asks from the timestamp of the previous poll's samples.
    assert nvml.asked_since[0] == 0 and nvml.asked_since[1] == nvml.now_us - 200_000 - 170_000


def test_a_busy_neighbours_later_sample_does_not_hide_this_processs_own() -> None:
    # On the H200 each process's sample has its own timestamp, a busy neighbour's the newer: asking from
    # the newest of all would filter this process's next share out, and read it idle.
    nvml = Nvml()
    nvml.processes = [7, PID]
    nvml.process_shares = {7: 98, PID: 2}
    nvml.sample_lag_us = {PID: 300_000}  # older than the neighbour's by more than a poll
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}))
    for _ in range(3):
        nvml.advance(99)
        assert meter.read({7, PID}) == busy.BusyReading(pytest.approx(0.02), vocabulary.SOURCE_PROCESS)


def test_a_reading_the_gpu_does_not_support_falls_back_then_gives_up() -> None:
    nvml = Nvml()
    nvml.processes = [PID]
    nvml.process_shares = {PID: 40}
    nvml.unsupported = {"samples"}
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}))
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(0.4), vocabulary.SOURCE_PROCESS)
    nvml.unsupported.add("process_utilization")
    assert meter.read({PID}) == vocabulary.NOT_SUPPORTED


def test_a_failing_call_is_raised_to_be_counted() -> None:
    nvml = Nvml()
    nvml.failing = {"samples"}
    with pytest.raises(pynvml.NVMLError):
        busy.BusyMeter(nvml, "gpu0", own=frozenset({PID})).read({PID})


def _pollers(registry, nvml: Nvml) -> tuple[NvmlPoller, ModelPoller]:
    metrics = metrics_for(registry, InstrumentConfig())
    device = NvmlPoller(metrics, DeviceIdentity("cuda:0", GPU_UUID), 0, 1.0, nvml=nvml, clock=nvml.clock)
    model = ModelPoller(
        series_for(metrics, "m"),
        torch.device("cpu"),  # where the headroom is read from: any device the CI machine has
        DeviceIdentity("cuda:0", GPU_UUID),
        1.0,
        peak_flops=None,
        peak_bandwidth=lambda: None,
        busy=lambda: device.busy,
    )
    return device, model


def test_the_busy_ratio_follows_its_source_and_says_why_it_is_missing(registry) -> None:
    nvml = Nvml()
    device, model = _pollers(registry, nvml)
    nvml.processes = [7, 8]  # shared, and this process is not among the PIDs NVML lists
    device.poll()
    model.poll()
    assert metric(registry, "llm_gpu_busy_unavailable", device="cuda:0", reason="process_ambiguous") == 1
    assert "llm_gpu_busy_ratio{" not in scrape(registry)

    nvml.processes = [HOST_PID]  # the neighbours left: the only process is this one
    nvml.advance(30, 50)
    device.poll()
    model.poll()
    assert metric(registry, "llm_gpu_busy_ratio", model="m", device="cuda:0", source="device") == 0.4
    assert "llm_gpu_busy_unavailable{" not in scrape(registry)
    assert metric(registry, "llm_nvml_process_gpu_memory_bytes", device="cuda:0") == 1 << 30

    nvml.processes = [7, PID]  # a neighbour came back: this process's own share, under its own PID
    nvml.process_shares = {7: 80, PID: 12}
    nvml.advance(90)
    device.poll()
    model.poll()
    assert metric(registry, "llm_gpu_busy_ratio", model="m", device="cuda:0", source="process") == 0.12
    assert 'source="device"' not in scrape(registry)  # one source at a time
    assert metric(registry, "llm_nvml_process_gpu_memory_bytes", device="cuda:0") == 2 << 30

    nvml.failing = {"processes"}  # a lost GPU: counted, and no busy ratio from a reading of the past
    device.poll()
    model.poll()
    assert metric(registry, "llm_instrumentation_errors_total", stage="nvml") == 1
    assert "llm_gpu_busy_ratio{" not in scrape(registry)


def test_the_reading_stays_published_while_the_next_is_read(registry) -> None:
    # The model poller reads the NVML poller's figure from its own thread at the same interval: while a
    # poll is inside NVML, the last reading stands (a gap there dropped the series on the H200).
    nvml = Nvml()
    device, _ = _pollers(registry, nvml)
    nvml.processes = [7, PID]
    nvml.process_shares = {PID: 30}
    nvml.watch = lambda: device.busy
    nvml.advance(50)
    device.poll()
    nvml.advance(50)
    device.poll()
    assert nvml.during_call == [None, busy.BusyReading(pytest.approx(0.3), vocabulary.SOURCE_PROCESS)]


def test_a_gpu_without_process_listing_says_not_supported(registry) -> None:
    nvml = Nvml()
    nvml.unsupported = {"processes"}
    device, model = _pollers(registry, nvml)
    device.poll()
    model.poll()
    assert metric(registry, "llm_gpu_busy_unavailable", device="cuda:0", reason="not_supported") == 1
    assert metric(registry, "llm_instrumentation_errors_total") is None


def test_no_nvml_says_nvml_unavailable(registry) -> None:
    class Absent(Nvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    device, _ = _pollers(registry, Absent())
    device.poll()
    assert metric(registry, "llm_gpu_busy_unavailable", device="cuda:0", reason="nvml_unavailable") == 1


@pytest.mark.parametrize(
    ("initial", "source"), [(True, vocabulary.SOURCE_DEVICE), (False, vocabulary.SOURCE_PROCESS)]
)
def test_alone_in_a_listing_counts_as_alone_only_where_the_listing_shows_every_process(
    initial: bool, source: str
) -> None:
    # In a PID namespace the driver lists the namespace's processes only (this one, as its PID there):
    # a busy neighbour outside would be in the GPU's figure, so the process's own share is read.
    nvml = Nvml()
    nvml.processes = [PID]
    nvml.process_shares = {PID: 7}
    nvml.advance(95, 95)  # the GPU is busy: mostly a neighbour's kernels, where one hides
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}), initial_namespace=initial)
    expected = 0.95 if source == vocabulary.SOURCE_DEVICE else 0.07
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(expected), source)


def test_the_initial_pid_namespace_is_told_apart(tmp_path) -> None:
    assert busy.in_initial_pid_namespace(str(tmp_path / "missing")) is False  # unknown: not assumed
    assert isinstance(busy.in_initial_pid_namespace(), bool)


class GpmNvml(Nvml):
    """:class:`Nvml` of a GPU with GPM: the graphics engine's active share between two samples is what
    the test sets before the later sample is taken; two samples 100 ms apart or closer give NaN, as on a
    real GPU. The sample buffers it hands out must all come back."""

    class Sample:
        taken_us: int | None = None
        graphics: float = 0.0

    class MetricsGet:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]

    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(self) -> None:
        super().__init__()
        self.graphics = 0.0  # percent, of the window the next sample closes
        self.live_samples: set[int] = set()

    def nvmlGpmQueryDeviceSupport(self, handle: str) -> SimpleNamespace:
        self._check("gpm")
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> Sample:
        sample = self.Sample()
        self.live_samples.add(id(sample))
        return sample

    def nvmlGpmSampleFree(self, sample: Sample) -> None:
        self.live_samples.remove(id(sample))

    def nvmlGpmSampleGet(self, handle: str, sample: Sample) -> None:
        sample.taken_us, sample.graphics = self.now_us, self.graphics

    def nvmlGpmMetricsGet(self, request: MetricsGet) -> None:
        first, second = request.sample1, request.sample2
        metric = request.metrics[0]
        assert request.numMetrics == 1 and metric.metricId == 1  # GRAPHICS_UTIL
        too_close = second.taken_us - first.taken_us <= 100_000
        metric.nvmlReturn, metric.value = 0, float("nan") if too_close else second.graphics


def test_the_only_process_on_a_gpu_with_gpm_reads_the_graphics_engine(registry) -> None:
    nvml = GpmNvml()
    device, model = _pollers(registry, nvml)
    nvml.advance(90, 90)  # NVML's utilization: busy periods, not kernel time
    device.poll()  # the first GPM sample opens a window: nothing to publish yet, and no reason missing
    model.poll()
    assert "llm_gpu_busy_ratio{" not in scrape(registry)
    assert "llm_gpu_busy_unavailable{" not in scrape(registry)
    nvml.graphics = 7.3
    nvml.advance(90, 90)
    device.poll()
    model.poll()
    assert metric(registry, "llm_gpu_busy_ratio", model="m", device="cuda:0", source="graphics") == 0.073
    assert 'source="device"' not in scrape(registry)


def test_graphics_windows_span_polls_and_restart_when_the_gpu_is_shared() -> None:
    nvml = GpmNvml()
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}), clock=nvml.clock)
    assert meter.read({PID}) is None  # the window opens
    nvml.graphics = 20.0
    nvml.advance(50)
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(0.2), vocabulary.SOURCE_GRAPHICS)
    nvml.graphics = 99.0
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(0.2), vocabulary.SOURCE_GRAPHICS)  # too soon
    nvml.processes = [7, PID]  # a neighbour: the GPU's figure is no longer this process's
    nvml.process_shares = {PID: 5}
    nvml.advance(99)
    assert meter.read({7, PID}) == busy.BusyReading(pytest.approx(0.05), vocabulary.SOURCE_PROCESS)
    nvml.processes = [PID]  # alone again: the neighbour's time is in no window of this process
    nvml.advance(10)
    assert meter.read({PID}) is None
    nvml.graphics = 4.0
    nvml.advance(10)
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(0.04), vocabulary.SOURCE_GRAPHICS)
    meter.close()
    assert nvml.live_samples == set()


def test_a_gpu_whose_gpm_is_not_supported_reads_its_utilization() -> None:
    nvml = GpmNvml()
    nvml.unsupported = {"gpm"}
    meter = busy.BusyMeter(nvml, "gpu0", own=frozenset({PID}))
    nvml.advance(30, 50)
    assert meter.read({PID}) == busy.BusyReading(pytest.approx(0.4), vocabulary.SOURCE_DEVICE)
    assert nvml.live_samples == set()


def test_a_released_poller_gives_its_gpm_buffers_back_on_the_worker_thread(registry) -> None:
    from inferwatch.instrumentation.device.worker import Worker

    nvml = GpmNvml()
    metrics = metrics_for(registry, InstrumentConfig())
    worker = Worker("test-nvml")
    poller = worker.acquire(
        "gpu0", lambda: NvmlPoller(metrics, DeviceIdentity("cuda:0", GPU_UUID), 0, 0.05, nvml=nvml)
    )
    deadline = time.monotonic() + 5
    while not nvml.live_samples and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(nvml.live_samples) == 2, poller
    worker.release("gpu0")
    while nvml.live_samples and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nvml.live_samples == set()
