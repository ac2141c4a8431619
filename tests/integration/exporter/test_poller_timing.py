"""The poller in-process over the NVML stand-in, where real threads and real time are the point: a hung
NVML call against a real timeout, the watchdog of a collection that overruns, a thread held up between
calls, the XID thread waiting on NVML's events, a kubelet that never answers while the poller runs, a
kubelet socket that never speaks against the List deadline. Moved out of the unit tier, which runs on a
manual clock (tests/unit/exporter/conftest.py)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch.common.clock import SYSTEM_CLOCK
from inferwatch.exporter.nvml import GpuContext, NvmlSession
from inferwatch.exporter.poller import GpuJob
from inferwatch.exporter.selfmetrics import GPU_UP, NVML_ERRORS, Tally
from tests.support import sample_value
from tests.support.fake_nvml import FakeNvml
from tests.support.kubelet import PodResourcesServer, gpu_pod
from tests.support.pollers import MakePoller, Pollers, gpu_value, render

pytestmark = pytest.mark.integration

WINDOW = 0.15  # seconds: the GPM window, above NVML's 100 ms minimum
POD_INFO = "gpu_kubernetes_pod_info"
ERRORS = "inferwatch_exporter_kubernetes_errors_total"
UP = "inferwatch_exporter_kubernetes_up"


@pytest.fixture
def fake() -> FakeNvml:
    """The stand-in on the real clock: two plain GPUs."""
    return FakeNvml()


@pytest.fixture
def make_poller(fake: FakeNvml) -> Iterator[MakePoller]:
    pollers = Pollers(fake, SYSTEM_CLOCK)
    yield pollers
    pollers.stop()


def test_a_hung_call_marks_only_its_gpu_stale_and_is_reported_once(
    make_poller: MakePoller, fake: Any
) -> None:
    poller = make_poller(interval=0.5, timeout=0.5)
    poller.collect()
    first_read = gpu_value(render(poller), "inferwatch_exporter_gpu_last_collect_timestamp_seconds", 1)
    fake.command("hang", gpu=1, call="nvmlDeviceGetTemperature", seconds=2.5)

    started = time.monotonic()
    poller.collect()
    assert time.monotonic() - started < 1.5  # the deadline, not the hang, bounds the collection
    poller.collect()  # the GPU's thread is still stuck: no second thread, no second report
    text = render(poller)
    assert gpu_value(text, "gpu_up", 1) == 0
    assert gpu_value(text, "gpu_up", 0) == 1
    assert gpu_value(text, "gpu_power_watts", 1) is None
    assert gpu_value(text, "inferwatch_exporter_gpu_last_collect_timestamp_seconds", 1) == first_read
    assert gpu_value(text, "inferwatch_exporter_gpu_last_collect_timestamp_seconds", 0) > first_read
    hung = sample_value(
        text, "inferwatch_exporter_nvml_errors_total", call="nvmlDeviceGetTemperature", error="hung"
    )
    assert hung == 1
    assert fake.calls[(1, "nvmlDeviceGetTemperature")] == 2  # the first poll's, and the one that hangs

    time.sleep(2.5)
    poller.collect()
    assert gpu_value(render(poller), "gpu_up", 1) == 1


def test_the_watchdog_reports_an_overrun_while_the_collection_still_runs(
    make_poller: MakePoller, fake: Any
) -> None:
    poller = make_poller(interval=0.2, timeout=2.0)
    fake.command("hang", gpu=0, call="nvmlDeviceGetPowerUsage", seconds=3)
    poller.start()
    deadline = time.monotonic() + 1.5
    while poller.overruns.get() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert poller.overruns.get() == 1
    assert not poller.ready.is_set()  # the first collection has not finished: the watchdog saw it run over


def test_an_xid_event_is_counted_with_its_time(make_poller: MakePoller, fake: Any) -> None:
    poller = make_poller(xid=True)
    poller.collect()
    deadline = time.monotonic() + 5
    while poller.xid_events.watched < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    fake.command("xid", gpu=1, xid=79)
    fake.command("xid", gpu=1, xid=79)
    while gpu_value(render(poller), "gpu_xid_errors_total", 1, xid="79") != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    text = render(poller)
    assert gpu_value(text, "gpu_xid_errors_total", 1, xid="79") == 2
    assert abs(gpu_value(text, "gpu_xid_last_timestamp_seconds", 1, xid="79") - time.time()) < 5
    # GPU 0 had none: its critical codes are there at 0 (born at zero), with no time of a last one.
    assert gpu_value(text, "gpu_xid_errors_total", 0) == 0
    assert gpu_value(text, "gpu_xid_last_timestamp_seconds", 0) is None
    assert sample_value(text, "inferwatch_exporter_xid_watched_gpus") == 2


class _SlowBetweenCalls:
    """A collector whose thread is held up outside NVML (as by a busy CPU) longer than the call timeout."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def collect(self, context: GpuContext) -> None:
        time.sleep(self.seconds)
        context.emit(GPU_UP, context.read("nvmlDeviceGetPowerUsage") or 0)


def test_hung_means_a_call_that_did_not_return_not_a_thread_that_waited_for_the_cpu(fake: Any) -> None:
    session = NvmlSession.open(fake)
    errors = Tally(NVML_ERRORS)
    late = GpuJob(GpuContext(fake, session.devices[0], errors), [_SlowBetweenCalls(0.6)])
    late.start()
    started = time.monotonic()
    assert late.wait(0.2)  # three times the timeout, but never inside one call for that long
    assert time.monotonic() - started >= 0.55

    fake.command("hang", gpu=1, call="nvmlDeviceGetPowerUsage", seconds=1)
    stuck = GpuJob(GpuContext(fake, session.devices[1], errors), [_SlowBetweenCalls(0.0)])
    stuck.start()
    started = time.monotonic()
    assert not stuck.wait(0.2)
    assert 0.15 < time.monotonic() - started < 0.9
    assert stuck.context.current is not None and stuck.context.current[0] == "nvmlDeviceGetPowerUsage"
    assert stuck.wait(5)  # the call returns when the hang ends


def test_a_driver_reset_during_a_hung_call_starts_no_second_thread_for_the_gpu(
    make_poller: MakePoller, fake: Any
) -> None:
    poller = make_poller(interval=0.3, timeout=0.3)
    poller.collect()
    fake.command("hang", gpu=1, call="nvmlDeviceGetTemperature", seconds=3)
    poller.collect()  # GPU 1 hung
    fake.command("driver_reset")
    for _ in range(4):  # NVML gone, reopened, and collected again, while GPU 1's thread is still stuck
        poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_up", 0) == 1 and gpu_value(text, "gpu_up", 1) == 0
    assert [t.name for t in threading.enumerate()].count("gpu1") == 1
    hung = sample_value(
        text, "inferwatch_exporter_nvml_errors_total", call="nvmlDeviceGetTemperature", error="hung"
    )
    assert hung == 1
    time.sleep(3)
    poller.collect()  # the stuck call returned: GPU 1 is read again, in the new session
    assert gpu_value(render(poller), "gpu_up", 1) == 1


def test_xid_floods_are_counted_in_full_and_logged_a_few_times(
    make_poller: MakePoller, fake: Any, caplog: pytest.LogCaptureFixture
) -> None:
    poller = make_poller(xid=True)
    poller.collect()
    deadline = time.monotonic() + 5
    while poller.xid_events.watched < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    with caplog.at_level(logging.WARNING, logger="inferwatch.exporter.xid"):
        for _ in range(3200):
            fake.command("xid", gpu=0, xid=79)
        while gpu_value(render(poller), "gpu_xid_errors_total", 0, xid="79") != 3200:
            assert time.monotonic() < deadline + 30
            time.sleep(0.05)
    lines = [r for r in caplog.records if "XID" in r.getMessage()]
    assert 1 <= len(lines) <= 5, [r.getMessage() for r in lines]


def test_the_buffers_of_a_gpu_stuck_in_nvml_are_left_alone_at_stop(
    make_poller: MakePoller, fake: Any
) -> None:
    poller = make_poller(interval=0.3, timeout=0.3, gpm={"window": WINDOW})
    poller.collect()
    time.sleep(WINDOW + 0.05)
    fake.command("hang", gpu=1, call="nvmlGpmSampleGet", seconds=1.5)
    poller.collect()  # GPU 1's thread is inside nvmlGpmSampleGet, with a buffer of its own
    poller.stop()
    # GPU 0's buffers are back; GPU 1's are still in use, and NVML stays initialised under its thread.
    assert fake.gpm_buffers_live() == 2
    assert fake.initialized


def test_a_kubelet_that_never_answers_delays_neither_scrapes_nor_collections(
    make_poller: MakePoller, fake: Any, tmp_path: Path
) -> None:
    fake.reset(gpus=2)
    kubelet = PodResourcesServer(str(tmp_path / "kubelet.sock"), [gpu_pod("ns", "a", "0")])
    with kubelet:
        poller = make_poller(
            interval=0.2, kubernetes={"timeout": 2.0, "interval": 1.0, "socket": kubelet.socket_path}
        )
        poller.pods.watcher.refresh()
        poller.collect()
        assert gpu_value(render(poller), POD_INFO, 0, namespace="ns", pod="a") == 1
        _hang_the_kubelet(kubelet, poller)


def _hang_the_kubelet(kubelet: PodResourcesServer, poller: Any) -> None:
    kubelet.mode = "hang"
    poller.start()
    deadline = time.monotonic() + 10
    while kubelet.lists < 2 and time.monotonic() < deadline:  # the watcher's first List is now stuck
        time.sleep(0.02)
    assert kubelet.lists >= 2

    # While that List waits for its 2 s deadline: scrapes answer from memory, collections go on.
    collected = sample_value(render(poller), "inferwatch_exporter_last_collect_timestamp_seconds")
    latencies = []
    for _ in range(10):
        started = time.perf_counter()
        text = render(poller)
        latencies.append(time.perf_counter() - started)
        time.sleep(0.05)
    assert sorted(latencies)[-2] < 0.1, latencies
    assert sample_value(text, "inferwatch_exporter_last_collect_timestamp_seconds") > collected
    assert sample_value(text, "inferwatch_exporter_collect_duration_seconds") < 0.5
    assert sample_value(text, "gpu_up", gpu="1") == 1

    # Then the deadline passes: the failure shows, and the pods' series go.
    text = wait_for(poller, lambda t: sample_value(t, ERRORS, error="timeout") >= 1)
    assert sample_value(text, UP) == 0
    text = wait_for(poller, lambda t: POD_INFO not in t)
    assert 1.9 < sample_value(text, "inferwatch_exporter_kubernetes_list_duration_seconds") < 3


def wait_for(poller: Any, predicate: Any, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = render(poller)
        if predicate(text):
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.05)


def test_a_socket_nobody_serves_is_unavailable_and_one_that_never_speaks_times_out(
    make_poller: MakePoller, tmp_path: Path
) -> None:
    socket_path = str(tmp_path / "kubelet.sock")
    poller = make_poller(kubernetes={"timeout": 0.3, "socket": socket_path})
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(socket_path)  # the file exists; nothing listens on it
        text = listed(poller)
    assert sample_value(text, ERRORS, error="unavailable") == 1
    os.unlink(socket_path)

    with socket.socket(socket.AF_UNIX) as silent:
        silent.bind(socket_path)
        silent.listen()  # connections are accepted by the kernel and never answered
        started = time.monotonic()
        text = listed(poller)
        assert time.monotonic() - started < 2
    assert sample_value(text, ERRORS, error="timeout") == 1
    assert POD_INFO not in text


def listed(poller: Any) -> str:
    """List once, collect once, and the scrape's text."""
    poller.pods.watcher.refresh()
    poller.collect()
    return render(poller)
