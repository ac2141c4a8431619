"""The exporter on a real GPU with the real NVML: every catalogue metric the GPU supports is exported and
plausible, a CUDA load started here moves utilization and power, and on a GPU with GPM it moves SM and
tensor activity and this process's SM utilization.

Which metrics to expect is asked of NVML directly (a call that answers means its series must be there),
so the test holds on GPUs with and without NVLink, MIG or ECC. Run on the GPU machine with
``python -m pytest tests/gpu/test_exporter_gpu.py -v``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import free_port, http_get, parse_samples, sample_value
from tests.support.services import start_process

pytestmark = pytest.mark.gpu

GPU = 0
MIB = 1 << 20


def gpu_value(text: str, metric: str, /, **labels: str) -> float | None:
    wanted = {"gpu": str(GPU), **labels}.items()
    found = [s.value for s in parse_samples(text) if s.name == metric and wanted <= s.labels.items()]
    return sum(found) if found else None


@dataclass
class Exporter:
    address: str
    pid: int

    def __call__(self) -> str:
        """Scrape it."""
        status, text = http_get(f"http://{self.address}/metrics")
        assert status == 200, text
        return text


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    """A real exporter (real pynvml, PCIe throughput on, 0.5 s polls), once GPU 0 is up."""
    address = f"127.0.0.1:{free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "inferwatch.exporter",
        f"--web.listen-address={address}",
        "--collector.interval=500ms",
        "--collector.pcie_throughput",
    ]
    log_path = tmp_path_factory.mktemp("exporter") / "exporter.log"
    with start_process(cmd, f"http://{address}/-/ready", 60, log_path=log_path) as proc:
        scrape = Exporter(address, proc.popen.pid)
        deadline = time.monotonic() + 30
        gpm = has_gpm()

        def ready(text: str) -> bool:  # GPU 0 read, and its first GPM window closed where it has GPM
            return gpu_value(text, "gpu_up") == 1 and (not gpm or gpu_value(text, SM_ACTIVE) is not None)

        while not ready(scrape()) and time.monotonic() < deadline:
            time.sleep(0.25)
        yield scrape


SM_ACTIVE = "gpu_sm_active_ratio"
GPM_METRICS = (
    SM_ACTIVE,
    "gpu_sm_occupancy_ratio",
    "gpu_tensor_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_fp16_active_ratio",
    "gpu_fp32_active_ratio",
    "gpu_fp64_active_ratio",
)


def has_gpm() -> bool:
    """Whether NVML's GPM answers on GPU 0 (Hopper and newer)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(GPU)
        return nvml_answers(lambda: pynvml.nvmlGpmQueryDeviceSupport(h)) and bool(
            pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
        )
    finally:
        pynvml.nvmlShutdown()


def nvml_answers(call: Callable[[], Any]) -> bool:
    import pynvml

    try:
        call()
    except pynvml.NVMLError as exc:
        if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False
        raise
    return True


def expected_metrics() -> list[str]:
    """The catalogue metrics whose NVML source answers on this GPU."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(GPU)
        sources: list[tuple[Callable[[], Any], tuple[str, ...]]] = [
            (lambda: pynvml.nvmlDeviceGetName(h), ("gpu_info", "gpu_up")),
            (
                lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
                ("gpu_utilization_ratio", "gpu_memory_bandwidth_utilization_ratio"),
            ),
            (
                lambda: pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
                (
                    "gpu_memory_total_bytes",
                    "gpu_memory_used_bytes",
                    "gpu_memory_free_bytes",
                    "gpu_memory_reserved_bytes",
                ),
            ),
            (lambda: pynvml.nvmlDeviceGetPowerUsage(h), ("gpu_power_watts",)),
            (lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h), ("gpu_power_limit_watts",)),
            (lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h), ("gpu_energy_joules_total",)),
            (lambda: pynvml.nvmlDeviceGetTemperature(h, 0), ("gpu_temperature_celsius",)),
            (lambda: pynvml.nvmlDeviceGetTemperatureThreshold(h, 1), ("gpu_temperature_threshold_celsius",)),
            (lambda: pynvml.nvmlDeviceGetClockInfo(h, 1), ("gpu_clock_hz",)),
            (lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, 1), ("gpu_clock_max_hz",)),
            (lambda: pynvml.nvmlDeviceGetPerformanceState(h), ("gpu_pstate",)),
            (lambda: pynvml.nvmlDeviceGetPersistenceMode(h), ("gpu_persistence_mode",)),
            (lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h), ("gpu_clocks_event_active",)),
            (
                lambda: _field_supported(pynvml, h, pynvml.NVML_FI_DEV_PERF_POLICY_POWER),
                ("gpu_clocks_event_seconds_total",),
            ),
            (
                lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                (
                    "gpu_pcie_link_gen",
                    "gpu_pcie_link_width",
                    "gpu_pcie_link_max_gen",
                    "gpu_pcie_link_max_width",
                ),
            ),
            (lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h), ("gpu_pcie_replays_total",)),
            (
                lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0),
                ("gpu_pcie_tx_bytes_per_second", "gpu_pcie_rx_bytes_per_second"),
            ),
            (lambda: pynvml.nvmlDeviceGetEccMode(h), ("gpu_ecc_mode",)),
            (lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0), ("gpu_ecc_errors_total",)),
            (
                lambda: pynvml.nvmlDeviceGetRemappedRows(h),
                ("gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed"),
            ),
            (lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h), ("gpu_processes",)),
            (lambda: pynvml.nvmlDeviceGetMigMode(h), ("gpu_mig_mode",)),
            (lambda: pynvml.nvmlDeviceGetNvLinkState(h, 0), ("gpu_nvlink_links_active",)),
        ]
        expected = [metric for call, metrics in sources if nvml_answers(call) for metric in metrics]
    finally:
        pynvml.nvmlShutdown()
    return expected + list(GPM_METRICS) if has_gpm() else expected


def _field_supported(pynvml: Any, handle: Any, field_id: int) -> None:
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(value.nvmlReturn)


def test_every_supported_catalogue_metric_is_exported_and_plausible(exporter: Exporter) -> None:
    import psutil
    import pynvml
    import torch

    text = exporter()
    missing = [m for m in expected_metrics() if gpu_value(text, m) is None]
    assert missing == [], f"NVML answers for these but the exporter has no series: {missing}"
    assert sample_value(text, "inferwatch_nvml_up") == 1
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert sample_value(text, "inferwatch_exporter_xid_watched_gpus") == gpus
    assert (
        gpu_value(text, "gpu_info", driver_version=driver if isinstance(driver, str) else driver.decode())
        == 1
    )

    # Memory: NVML's total is torch's, or torch's plus the memory the driver reserves.
    total, reserved = gpu_value(text, "gpu_memory_total_bytes"), gpu_value(text, "gpu_memory_reserved_bytes")
    used, free = gpu_value(text, "gpu_memory_used_bytes"), gpu_value(text, "gpu_memory_free_bytes")
    torch_totals = {torch.cuda.get_device_properties(GPU).total_memory, torch.cuda.mem_get_info(GPU)[1]}
    matches = [t for t in torch_totals if t == total or abs(t - (total - reserved)) <= 2 * MIB]
    assert matches, f"NVML total {total}, reserved {reserved}; torch totals {sorted(torch_totals)}"
    assert used + free + reserved <= total + 2 * MIB

    power, limit = gpu_value(text, "gpu_power_watts"), gpu_value(text, "gpu_power_limit_watts")
    assert 0 < power <= limit
    for clock in ("graphics", "sm", "memory"):
        assert (
            0
            < gpu_value(text, "gpu_clock_hz", clock=clock)
            <= gpu_value(text, "gpu_clock_max_hz", clock=clock)
        )
    die = gpu_value(text, "gpu_temperature_celsius", sensor="gpu")
    assert 10 < die < gpu_value(text, "gpu_temperature_threshold_celsius", kind="slowdown")
    assert 0 <= gpu_value(text, "gpu_utilization_ratio") <= 1
    assert gpu_value(text, "gpu_pcie_link_gen") <= gpu_value(text, "gpu_pcie_link_max_gen")
    assert gpu_value(text, "gpu_pcie_link_width") <= gpu_value(text, "gpu_pcie_link_max_width")
    uptime = time.time() - psutil.boot_time()
    for sample in parse_samples(text):
        if sample.name == "gpu_clocks_event_seconds_total" and sample.labels["gpu"] == str(GPU):
            assert 0 <= sample.value <= uptime, sample
    reasons = [
        s for s in parse_samples(text) if s.name == "gpu_clocks_event_active" and s.labels["gpu"] == str(GPU)
    ]
    assert reasons and all(s.value in (0, 1) for s in reasons)

    # Energy is in joules: its rate over a few seconds is the power drawn meanwhile.
    first = exporter()
    time.sleep(3)
    second = exporter()
    seconds = sample_value(second, "inferwatch_exporter_last_collect_timestamp_seconds") - sample_value(
        first, "inferwatch_exporter_last_collect_timestamp_seconds"
    )
    watts = (
        gpu_value(second, "gpu_energy_joules_total") - gpu_value(first, "gpu_energy_joules_total")
    ) / seconds
    mean_power = (gpu_value(first, "gpu_power_watts") + gpu_value(second, "gpu_power_watts")) / 2
    assert mean_power / 2 < watts < mean_power * 2, (watts, mean_power)
    assert gpu_value(second, "inferwatch_exporter_gpu_collect_duration_seconds") < 0.5


@contextlib.contextmanager
def matmul_load() -> Iterator[None]:
    """A bf16 8192² matmul loop on GPU 0, in a thread of this process, while the block runs."""
    import torch

    device = torch.device("cuda", GPU)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for _ in range(20):
                torch.matmul(a, b)
            torch.cuda.synchronize(device)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(timeout=30)


def test_a_cuda_load_moves_utilization_and_power(exporter: Exporter) -> None:
    def readings(seconds: float) -> list[tuple[float, float, float]]:
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = exporter()
            out.append(
                (
                    gpu_value(text, "gpu_utilization_ratio"),
                    gpu_value(text, "gpu_power_watts"),
                    gpu_value(text, "gpu_memory_used_bytes"),
                )
            )
            time.sleep(0.25)
        return out

    import torch

    # Memory an earlier test of this process left in torch's cache is already used in NVML's eyes, and
    # would serve the load's tensors: the used bytes would not move.
    torch.cuda.empty_cache()
    idle = readings(2.0)
    with matmul_load():
        time.sleep(1.0)  # NVML's power reading averages over about a second
        loaded = readings(6.0)

    idle_util, idle_power = max(r[0] for r in idle), max(r[1] for r in idle)
    busy_util, busy_power = max(r[0] for r in loaded), max(r[1] for r in loaded)
    assert busy_util >= 0.5 and busy_util > idle_util + 0.3, (idle, loaded)
    assert busy_power > idle_power + 50, (idle, loaded)
    # The load's tensors are in device memory the exporter reports as used.
    assert max(r[2] for r in loaded) - min(r[2] for r in idle) >= 2 * 8192 * 8192 * 2 - 64 * MIB


def test_gpm_and_process_utilization_follow_a_bf16_matmul_load(exporter: Exporter) -> None:
    if not has_gpm():
        pytest.skip("GPU 0 has no NVML GPM (before Hopper)")
    pid = str(os.getpid())

    def readings(seconds: float) -> list[dict[str, float | None]]:
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = exporter()
            out.append(
                {
                    "sm": gpu_value(text, SM_ACTIVE, gpu_instance=""),
                    "tensor": gpu_value(text, "gpu_tensor_active_ratio", gpu_instance=""),
                    "process_sm": gpu_value(text, "gpu_process_sm_utilization_ratio", pid=pid),
                }
            )
            time.sleep(0.5)
        return out

    time.sleep(2.5)  # a GPM window that still held the previous test's load has closed
    idle = readings(2.5)  # this process has a CUDA context from the tests before: it is on the GPU
    with matmul_load():
        time.sleep(2.5)  # past the GPM window (1 s) that opened before the load
        loaded = readings(4.0)
    # Every reading is a figure (no NaN, no gap), within 0..1.
    assert all(r["sm"] is not None and 0 <= r["sm"] <= 1 for r in idle + loaded), (idle, loaded)
    assert max(r["sm"] for r in idle) < 0.1 and max(r["tensor"] for r in idle) < 0.05, idle
    # The figures on an H200: SM 96 %, tensor 93 % under this load.
    assert min(r["sm"] for r in loaded) > 0.8 and min(r["tensor"] for r in loaded) > 0.8, loaded
    busy = [r["process_sm"] for r in loaded if r["process_sm"] is not None]
    assert busy and max(busy) > 0.5, loaded


def test_the_exporter_never_loads_torch_and_stays_small(exporter: Exporter) -> None:
    with open(f"/proc/{exporter.pid}/maps", encoding="utf-8") as maps:
        mapped = {line.split()[-1] for line in maps if "/" in line}
    # torch's own libraries (libtorch*.so, torch/_C*.so), not any path under a venv that happens to be
    # called "torch" (the GPU machine's Python lives in /opt/torch/.venv).
    assert not [path for path in mapped if "/torch/lib/" in path or "/torch/_C" in path]
    assert any("libnvidia-ml" in path for path in mapped)  # the maps do list NVML, which it did load
    assert sample_value(exporter(), "process_resident_memory_bytes") < 60 * MIB
