"""GPM profiling metrics and per-process utilization, over the NVML stand-in: the window between samples,
what a GPU without GPM, a NaN, a failing call and a lost GPU do, and that NVML's sample buffers are given
back. That the figures are right is for the real GPU (tests/gpu/test_exporter_gpu.py,
tests/benchmarks/gpu_gpm.py): the stand-in's values are constants."""

from __future__ import annotations

import os
from typing import Any

from inferwatch.exporter.poller import Poller
from tests.support import parse_samples, sample_value
from tests.support.clock import ManualClock
from tests.unit.exporter.conftest import MakePoller, gpu_value, render

WINDOW = 0.15  # seconds: above NVML's 100 ms minimum
PAST_WINDOW = WINDOW + 0.05  # how far the clock moves to close a window


def collect_over_windows(poller: Poller, clock: ManualClock, windows: int = 1) -> None:
    """Collect, then again each time a window has passed: the first collection opens a GPM window, each
    later one closes one."""
    poller.collect()
    for _ in range(windows):
        clock.advance(PAST_WINDOW)
        poller.collect()


def gpm_errors(text: str, call: str, error: str) -> float | None:
    return sample_value(text, "inferwatch_exporter_nvml_errors_total", call=call, error=error)


def test_each_reading_is_a_ratio_over_the_window_between_two_samples(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    poller = make_poller(gpm={"window": WINDOW})
    poller.collect()  # opens the window: no reading yet
    assert gpu_value(render(poller), "gpu_sm_active_ratio", 0) is None

    clock.advance(PAST_WINDOW)
    poller.collect()  # closes it
    text, closing_samples = render(poller), fake.calls[(0, "nvmlGpmSampleGet")]
    poller.collect()  # within the next window (the clock has not moved): the last window's values
    within = render(poller)
    for gpu in (0, 1):
        assert gpu_value(text, "gpu_graphics_active_ratio", gpu, gpu_instance="") == 0.70
        assert gpu_value(text, "gpu_sm_active_ratio", gpu, gpu_instance="") == 0.60
        assert gpu_value(text, "gpu_sm_occupancy_ratio", gpu) == 0.25
        assert gpu_value(text, "gpu_tensor_active_ratio", gpu) == 0.45
        assert gpu_value(text, "gpu_dram_active_ratio", gpu) == 0.30
        assert gpu_value(text, "gpu_fp16_active_ratio", gpu) == 0.05
        assert gpu_value(text, "gpu_fp32_active_ratio", gpu) == 0.10
        assert gpu_value(text, "gpu_fp64_active_ratio", gpu) == 0.0
        assert gpu_value(text, "gpu_pcie_tx_bytes_per_second", gpu) == 100 * 2**20  # MiB/s in NVML
        assert gpu_value(text, "gpu_pcie_rx_bytes_per_second", gpu) == 200 * 2**20
        assert gpu_value(text, "gpu_nvlink_tx_bytes_per_second", gpu) is None  # no NVLink on these GPUs
    assert closing_samples == 2
    assert gpu_value(within, "gpu_sm_active_ratio", 0) == 0.60
    assert fake.calls[(0, "nvmlGpmSampleGet")] == 2
    assert fake.calls[(0, "nvmlGpmMetricsGet")] == 1


def test_the_window_is_independent_of_the_poll_interval(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    # Polls every 40 ms for 1 s, far under NVML's 100 ms minimum: the samples stay a window apart, none
    # is NaN.
    poller = make_poller(interval=0.04, gpm={"window": 0.3})
    for _ in range(25):
        poller.collect()
        clock.advance(0.04)
    text = render(poller)
    samples = fake.calls[(0, "nvmlGpmSampleGet")]
    assert 3 <= samples <= 5, samples  # one opening sample and one per ~0.3 s, not one per poll
    assert gpu_value(text, "gpu_sm_active_ratio", 0) == 0.60
    assert gpm_errors(text, "nvmlGpmMetricsGet", "nan") is None


def test_a_gpu_without_gpm_reports_not_supported_once_and_has_no_series(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    fake.reset(gpus=2, no_gpm=[1])
    poller = make_poller(gpm={"window": WINDOW}, pcie_throughput=True)
    collect_over_windows(poller, clock, 2)
    text = render(poller)

    assert gpu_value(text, "gpu_sm_active_ratio", 1) is None
    assert gpu_value(text, "gpu_sm_active_ratio", 0) == 0.60
    assert gpm_errors(text, "nvmlGpmQueryDeviceSupport", "not_supported") == 1
    assert fake.calls[(1, "nvmlGpmQueryDeviceSupport")] == 1
    assert fake.calls[(1, "nvmlGpmSampleGet")] == 0
    assert gpu_value(text, "gpu_up", 1) == 1
    # Its PCIe throughput comes from the blocking reading, which GPM spares the other GPU.
    assert gpu_value(text, "gpu_pcie_tx_bytes_per_second", 1) == 2048 * 1024
    assert fake.calls[(1, "nvmlDeviceGetPcieThroughput")] == 6
    # A GPU with GPM is never read the blocking way: that is decided once per GPU, not from GPM's series.
    assert fake.calls[(0, "nvmlDeviceGetPcieThroughput")] == 0


def test_nan_readings_are_left_out_and_counted(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    fake.reset(gpus=2, gpm_nan=[0])
    poller = make_poller(gpm={"window": WINDOW})
    collect_over_windows(poller, clock)
    text = render(poller)

    assert gpu_value(text, "gpu_sm_active_ratio", 0) is None
    assert gpu_value(text, "gpu_tensor_active_ratio", 0) is None
    assert gpu_value(text, "gpu_sm_active_ratio", 1) == 0.60
    assert gpm_errors(text, "nvmlGpmMetricsGet", "nan") == 10  # each of 8 activities and 2 PCIe directions
    assert "NaN" not in text


def test_a_failing_call_loses_only_the_gpm_series_of_its_gpu(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    fake.reset(gpus=2, failing={"nvmlGpmSampleGet": [0]})
    poller = make_poller(gpm={"window": WINDOW})
    collect_over_windows(poller, clock, 2)
    text = render(poller)

    assert gpu_value(text, "gpu_sm_active_ratio", 0) is None
    assert gpu_value(text, "gpu_sm_active_ratio", 1) == 0.60
    assert gpu_value(text, "gpu_power_watts", 0) == 350
    assert gpu_value(text, "gpu_up", 0) == 1
    assert gpm_errors(text, "nvmlGpmSampleGet", "unknown") == 3  # not learned: asked again every poll
    assert sample_value(text, "inferwatch_exporter_collector_errors_total", collector="gpm") == 0


def test_a_lost_gpu_opens_a_new_window_and_keeps_its_buffers(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    poller = make_poller(gpm={"window": WINDOW})
    collect_over_windows(poller, clock)
    assert fake.gpm_buffers_live() == 4  # two per GPU, for as long as the session lasts

    fake.command("lose", gpu=1)
    poller.collect()
    fake.command("recover", gpu=1)
    clock.advance(PAST_WINDOW)
    poller.collect()  # a window across the loss would mix counters from before a reset: a new one opens
    text = render(poller)
    assert gpu_value(text, "gpu_up", 1) == 1
    assert gpu_value(text, "gpu_sm_active_ratio", 1) is None
    assert gpu_value(text, "gpu_sm_active_ratio", 0) == 0.60
    clock.advance(PAST_WINDOW)
    poller.collect()
    assert gpu_value(render(poller), "gpu_sm_active_ratio", 1) == 0.60
    assert fake.gpm_buffers_live() == 4


def test_buffers_are_given_back_when_nvml_goes_and_when_the_exporter_stops(
    make_poller: MakePoller, fake: Any
) -> None:
    fake.reset(gpus=2, mig=[1])
    poller = make_poller(gpm={"window": WINDOW})
    poller.collect()
    assert fake.gpm_buffers_live() == 2 * 2 + 2 * 2  # each GPU, and GPU 1's two GPU instances

    fake.command("driver_reset")
    poller.collect()  # NVML answers "uninitialised": the session closes, its buffers freed first
    assert fake.gpm_buffers_live() == 0
    poller.collect()
    assert fake.gpm_buffers_live() == 8

    poller.stop()
    assert fake.gpm_buffers_live() == 0


def test_mig_instances_have_their_own_series_and_a_removed_one_its_buffers_freed(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    fake.reset(gpus=2, mig=[1])
    poller = make_poller(gpm={"window": WINDOW})
    collect_over_windows(poller, clock)
    text = render(poller)
    assert gpu_value(text, "gpu_sm_active_ratio", 1, gpu_instance="1") == 0.30
    assert gpu_value(text, "gpu_sm_active_ratio", 1, gpu_instance="2") == 0.30
    assert gpu_value(text, "gpu_sm_active_ratio", 1, gpu_instance="") == 0.60
    assert gpu_value(text, "gpu_sm_active_ratio", 0, gpu_instance="1") is None
    # Throughputs are of the whole GPU: none per instance.
    pcie = [
        s for s in parse_samples(text) if s.name == "gpu_pcie_tx_bytes_per_second" and s.labels["gpu"] == "1"
    ]
    assert len(pcie) == 1

    fake.command("mig_slots", slots=[0])
    poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_sm_active_ratio", 1, gpu_instance="2") is None
    assert gpu_value(text, "gpu_sm_active_ratio", 1, gpu_instance="1") == 0.30
    assert fake.gpm_buffers_live() == 6


def test_gpm_off_makes_no_gpm_call(make_poller: MakePoller, fake: Any) -> None:
    poller = make_poller(gpm=False)
    poller.collect()
    assert not [call for (_, call) in fake.calls if call.startswith("nvmlGpm")]
    assert fake.gpm_buffers_live() == 0


def test_process_utilization_tells_a_busy_process_from_an_idle_one(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    busy, idle = os.getpid(), os.getppid()
    fake.reset(gpus=1, processes={0: [[busy, 2 << 30, 80, 30], [idle, 1 << 30]]})
    poller = make_poller()
    poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_process_sm_utilization_ratio", 0, pid=str(busy)) == 0.8
    assert gpu_value(text, "gpu_process_memory_bandwidth_utilization_ratio", 0, pid=str(busy)) == 0.3
    assert gpu_value(text, "gpu_process_sm_utilization_ratio", 0, pid=str(idle)) == 0.0

    clock.advance(0.2)  # the stand-in's next sample period
    poller.collect()  # only the samples newer than the last poll's count
    assert gpu_value(render(poller), "gpu_process_sm_utilization_ratio", 0, pid=str(busy)) == 0.8

    fake.reset(gpus=1, processes={0: [[idle, 1 << 30]]})
    quiet = make_poller()
    quiet.collect()  # no process was busy: NVML answers NOT_FOUND, which means 0, not unknown
    assert gpu_value(render(quiet), "gpu_process_sm_utilization_ratio", 0, pid=str(idle)) == 0.0

    fake.reset(
        gpus=1, processes={0: [[busy, 2 << 30, 80, 30]]}, failing={"nvmlDeviceGetProcessUtilization": [0]}
    )
    failing = make_poller()
    failing.collect()
    text = render(failing)
    assert gpu_value(text, "gpu_process_sm_utilization_ratio", 0) is None  # unknown, not 0
    assert gpu_value(text, "gpu_process_memory_bytes", 0, pid=str(busy)) == 2 << 30


def test_without_the_gpm_collector_every_gpu_gets_the_blocking_pcie_reading(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    poller = make_poller(gpm=False, pcie_throughput=True)
    collect_over_windows(poller, clock)
    text = render(poller)
    for gpu in (0, 1):
        assert gpu_value(text, "gpu_pcie_tx_bytes_per_second", gpu) == 2048 * 1024
        assert fake.calls[(gpu, "nvmlDeviceGetPcieThroughput")] == 4  # two directions, two polls
    assert not [call for (_, call) in fake.calls if call.startswith("nvmlGpm")]
