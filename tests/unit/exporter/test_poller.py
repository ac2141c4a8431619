"""The poller and collectors in-process, over the NVML stand-in: what is exported, and every fault path."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from tests.support import parse_samples, sample_value
from tests.support.clock import ManualClock
from tests.support.fake_nvml_types import NVML_ERROR_NOT_SUPPORTED
from tests.unit.exporter.conftest import MakePoller, gpu_value, own_process, render

GIB = 1 << 30


def own_comm() -> str:
    with open(f"/proc/{os.getpid()}/comm", encoding="utf-8") as comm:
        return comm.read().strip()


def test_every_gpu_series_is_exported_with_the_values_nvml_gave(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(gpus=2, processes={0: own_process()})
    poller = make_poller()
    poller.collect()
    text = render(poller)

    assert sample_value(text, "inferwatch_nvml_up") == 1
    for gpu in (0, 1):
        uuid = f"GPU-fa4e0000-0000-4000-8000-{gpu:012d}"
        assert gpu_value(text, "gpu_up", gpu, uuid=uuid) == 1
        assert gpu_value(
            text, "gpu_info", gpu, uuid=uuid, name="NVIDIA H200 (stand-in)", compute_capability="9.0"
        )
        assert gpu_value(text, "gpu_memory_total_bytes", gpu) == 141 * GIB
        assert gpu_value(text, "gpu_memory_used_bytes", gpu) == 20 * GIB
        assert gpu_value(text, "gpu_memory_reserved_bytes", gpu) == GIB // 2
        assert gpu_value(text, "gpu_power_watts", gpu) == 350
        assert gpu_value(text, "gpu_power_limit_watts", gpu) == 700
        assert gpu_value(text, "gpu_temperature_celsius", gpu, sensor="gpu") == 45
        assert gpu_value(text, "gpu_temperature_celsius", gpu, sensor="memory") == 52
        assert gpu_value(text, "gpu_temperature_threshold_celsius", gpu, kind="slowdown") == 89
        assert gpu_value(text, "gpu_clock_hz", gpu, clock="sm") == 1755e6
        assert gpu_value(text, "gpu_clock_max_hz", gpu, clock="sm") == 1980e6
        assert gpu_value(text, "gpu_pstate", gpu) == 0
        assert gpu_value(text, "gpu_clocks_event_active", gpu, reason="sw_power_cap") == 1
        assert gpu_value(text, "gpu_clocks_event_active", gpu, reason="gpu_idle") == 0
        reasons = [
            s for s in parse_samples(text) if s.name == "gpu_clocks_event_active" and s.labels["gpu"] == "0"
        ]
        assert len(reasons) == 9  # one per bit of the supported mask 0x1FF
        assert gpu_value(text, "gpu_pcie_link_gen", gpu) == 5
        assert gpu_value(text, "gpu_ecc_errors_total", gpu, type="corrected", scope="volatile") == 2
        assert gpu_value(text, "gpu_remapped_rows", gpu, cause="correctable") == 1
    comm = own_comm()
    assert gpu_value(text, "gpu_process_memory_bytes", 0, pid=str(os.getpid()), comm=comm) == 3 * GIB
    # The PIDs NVML reports make serving processes of their own accord (--processes.gpu).
    assert sample_value(text, "inferwatch_process_resident_memory_bytes", pid=str(os.getpid()), comm=comm) > 0
    assert sample_value(text, "host_memory_total_bytes") > 0


def test_utilization_is_the_mean_of_the_samples_since_the_last_poll(
    make_poller: MakePoller, fake: Any
) -> None:
    # The stand-in's samples alternate 90 % and 10 %: any point reading is 0.9 or 0.1, the mean 0.5.
    poller = make_poller()
    poller.collect()
    assert 0.45 <= gpu_value(render(poller), "gpu_utilization_ratio", 0) <= 0.55

    fake.reset(not_supported={"nvmlDeviceGetSamples": [0]})
    fallback = make_poller()
    fallback.collect()
    assert gpu_value(render(fallback), "gpu_utilization_ratio", 0) in (0.9, 0.1)  # the point reading


def test_an_unsupported_call_is_learned_once_and_not_retried(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(gpus=2, not_supported={"nvmlDeviceGetPowerUsage": [1]})
    poller = make_poller()
    for _ in range(3):
        poller.collect()
    text = render(poller)

    assert fake.calls[(1, "nvmlDeviceGetPowerUsage")] == 1
    assert fake.calls[(0, "nvmlDeviceGetPowerUsage")] == 3
    assert gpu_value(text, "gpu_power_watts", 1) is None
    assert gpu_value(text, "gpu_power_watts", 0) == 350
    assert gpu_value(text, "gpu_power_limit_watts", 1) == 700  # the rest of the GPU is still served
    assert gpu_value(text, "gpu_up", 1) == 1
    errors = sample_value(text, "inferwatch_exporter_nvml_errors_total", call="nvmlDeviceGetPowerUsage")
    assert errors == 1


def test_a_lost_gpu_is_served_as_down_and_the_others_as_usual(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(gpus=3)
    poller = make_poller()
    poller.collect()
    fake.command("lose", gpu=1)
    poller.collect()
    text = render(poller)

    assert gpu_value(text, "gpu_up", 1) == 0
    assert gpu_value(text, "gpu_power_watts", 1) is None
    assert gpu_value(text, "gpu_up", 0) == gpu_value(text, "gpu_up", 2) == 1
    assert gpu_value(text, "gpu_power_watts", 2) == 350
    assert sample_value(text, "inferwatch_exporter_nvml_errors_total", error="gpu_lost") == 1
    assert sample_value(text, "host_cpus") > 0

    fake.command("recover", gpu=1)
    poller.collect()
    assert gpu_value(render(poller), "gpu_up", 1) == 1


def test_counters_are_nvmls_since_driver_load_so_a_reset_is_a_reset_and_a_restart_nothing(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    counters = (
        ("gpu_energy_joules_total", {}),
        ("gpu_clocks_event_seconds_total", {"reason": "sw_power_cap"}),
        ("gpu_ecc_errors_total", {"type": "corrected", "scope": "volatile"}),
    )
    poller = make_poller()
    clock.advance(0.3)  # let the stand-in's energy and throttle counters grow
    poller.collect()
    before = {name: gpu_value(render(poller), name, 0, **labels) for name, labels in counters}
    assert all(value > 0 for value in before.values())
    restarted = make_poller()  # a second exporter over the same driver serves the same counts
    restarted.collect()
    for name, labels in counters:
        assert gpu_value(render(restarted), name, 0, **labels) >= before[name], name

    fake.command("driver_reset")
    poller.collect()  # NVML answers "uninitialised": the session is closed and the GPUs served as down
    assert gpu_value(render(poller), "gpu_up", 0) == 0
    poller.collect()  # reopened: the counters restarted from zero, and are served so
    text = render(poller)
    assert sample_value(text, "inferwatch_nvml_up") == 1
    assert gpu_value(text, "gpu_up", 0) == 1
    for name, labels in counters:
        assert gpu_value(text, name, 0, **labels) < before[name], name


def test_without_nvml_host_metrics_are_served_and_init_is_retried_slowly(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    fake.reset(init_failures=2)
    poller = make_poller(nvml_retry_interval=0.3)
    poller.collect()
    poller.collect()  # within the retry interval: no second attempt
    text = render(poller)
    assert sample_value(text, "inferwatch_nvml_up") == 0
    assert sample_value(text, "host_cpu_seconds_total", mode="user") > 0
    assert poller.ready.is_set()
    assert fake.calls[(-1, "nvmlInit")] == 1

    for attempts in (2, 3):
        clock.advance(0.35)
        poller.collect()
        assert fake.calls[(-1, "nvmlInit")] == attempts
    assert sample_value(render(poller), "inferwatch_nvml_up") == 1


def test_a_failing_collector_loses_only_its_own_series(
    make_poller: MakePoller, fake: Any, monkeypatch
) -> None:
    monkeypatch.setattr(fake, "nvmlDeviceGetRemappedRows", lambda handle: (0, 0))  # malformed: 2 of 4 values
    poller = make_poller()
    poller.collect()
    poller.collect()
    text = render(poller)
    # Two collections of two GPUs each.
    assert sample_value(text, "inferwatch_exporter_collector_errors_total", collector="ecc") == 4
    assert gpu_value(text, "gpu_ecc_mode", 0) is None  # emitted before the failure, then dropped
    assert gpu_value(text, "gpu_power_watts", 0) == 350
    assert gpu_value(text, "gpu_up", 0) == 1


def test_gpu_process_series_are_capped_and_named_by_comm(make_poller: MakePoller, fake: Any) -> None:
    gone = 1 << 23  # above Linux's largest pid_max: no such process
    fake.reset(gpus=1, processes={0: [[gone + i, (i + 1) * GIB] for i in range(4)] + own_process()})
    poller = make_poller(processes={"max_processes": 2, "gpu_processes": False})
    poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_processes", 0) == 5
    shown = {s.labels["pid"]: s for s in parse_samples(text) if s.name == "gpu_process_memory_bytes"}
    assert set(shown) == {str(gone + 3), str(gone + 2)}  # the two largest
    assert shown[str(gone + 3)].labels["comm"] == "unknown"
    assert set(shown[str(gone + 3)].labels) == {"gpu", "uuid", "pid", "comm"}
    assert sample_value(text, "inferwatch_processes_matched") == 0  # --no-processes.gpu


def test_serving_processes_are_matched_by_pid_file_and_name(make_poller: MakePoller, tmp_path) -> None:
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    comm = own_comm()
    poller = make_poller(
        processes={"pid_files": (str(pid_file),), "name_pattern": re.compile(f"^{re.escape(comm)}$")}
    )
    poller.collect()
    text = render(poller)
    labels = {"pid": str(os.getpid()), "comm": comm}
    assert sample_value(text, "inferwatch_process_resident_memory_bytes", **labels) > 10 << 20
    assert sample_value(text, "inferwatch_process_threads", **labels) >= 1
    assert sample_value(text, "inferwatch_process_cpu_seconds_total", mode="user", **labels) > 0
    # Pytest may run as several processes named alike, but this one is listed once.
    own = [
        s
        for s in parse_samples(text)
        if s.name == "inferwatch_process_threads" and s.labels["pid"] == labels["pid"]
    ]
    assert len(own) == 1


def test_nvlink_and_mig_series_where_the_gpu_has_them(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(gpus=3, nvlink=[0], mig=[1])
    poller = make_poller()
    poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_nvlink_links_active", 0) == 4
    assert gpu_value(text, "gpu_nvlink_errors_total", 0, type="replay") == 1
    assert gpu_value(text, "gpu_nvlink_links_active", 1) is None
    assert gpu_value(text, "gpu_mig_mode", 1) == 1
    assert gpu_value(text, "gpu_mig_mode", 2) == 0
    assert gpu_value(text, "gpu_mig_memory_total_bytes", 1, mig="1") == 18 * GIB
    assert len([s for s in parse_samples(text) if s.name == "gpu_mig_memory_used_bytes"]) == 2
    poller.collect()  # the link range is probed once: the non-NVLink GPU is not asked again
    assert fake.calls[(2, "nvmlDeviceGetNvLinkState")] == 1


def test_gpu_selection_by_index_and_uuid(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(gpus=3)
    poller = make_poller(gpus=("2", "GPU-fa4e0000-0000-4000-8000-000000000000"))
    poller.collect()
    up = {s.labels["gpu"] for s in parse_samples(render(poller)) if s.name == "gpu_up"}
    assert up == {"0", "2"}


def test_calls_older_drivers_lack_fall_back_to_their_predecessors(
    make_poller: MakePoller, fake: Any, monkeypatch
) -> None:
    fake.reset(
        gpus=1,
        not_supported={
            "nvmlDeviceGetCurrentClocksEventReasons": [0],
            "nvmlDeviceGetSupportedClocksEventReasons": [0],
        },
    )
    # Pre-R535 names of the clocks-event calls, and a memory call without the v2 structure.
    monkeypatch.setattr(fake, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda handle: 0x40, raising=False)
    monkeypatch.setattr(
        fake, "nvmlDeviceGetSupportedClocksThrottleReasons", lambda handle: 0x7F, raising=False
    )
    v2_memory = fake.nvmlDeviceGetMemoryInfo

    def v1_memory(handle: Any, version: int | None = None) -> Any:
        if version is not None:
            raise fake.NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return v2_memory(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", v1_memory)
    poller = make_poller()
    poller.collect()
    poller.collect()
    text = render(poller)
    assert gpu_value(text, "gpu_clocks_event_active", 0, reason="hw_thermal_slowdown") == 1
    assert len([s for s in parse_samples(text) if s.name == "gpu_clocks_event_active"]) == 7  # mask 0x7F
    assert gpu_value(text, "gpu_memory_used_bytes", 0) == 20 * GIB + GIB // 2  # v1 counts reserved as used
    assert gpu_value(text, "gpu_memory_reserved_bytes", 0) is None


def test_firmware_readings_take_turns_and_their_last_values_are_served_between(
    make_poller: MakePoller, fake: Any
) -> None:
    fake.reset(gpus=1, processes={0: own_process()})
    poller = make_poller()
    pid = str(os.getpid())
    poller.collect()  # the first poll reads everything: every series is there from the start
    firmware = (
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetProcessUtilization",
    )
    assert [fake.calls[(0, call)] for call in firmware] == [2, 1, 1]
    for _ in range(8):
        before = {call: fake.calls[(0, call)] for call in firmware}
        poller.collect()
        made = sum(fake.calls[(0, call)] - before[call] for call in firmware)
        assert made == 1, "one slow reading per poll"
        text = render(poller)
        assert gpu_value(text, "gpu_utilization_ratio", 0) is not None
        assert gpu_value(text, "gpu_memory_bandwidth_utilization_ratio", 0) is not None
        assert gpu_value(text, "gpu_energy_joules_total", 0) is not None
        assert [s for s in parse_samples(text) if s.name == "gpu_process_sm_utilization_ratio"], pid
        assert gpu_value(text, "gpu_power_watts", 0) == 350  # cheap: read every poll
    assert [fake.calls[(0, call)] for call in firmware] == [2 + 4, 1 + 2, 1 + 2]


def test_a_collection_that_fails_as_a_whole_is_counted_and_the_next_one_runs(
    make_poller: MakePoller, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    poller = make_poller(interval=0.1)
    collect = poller.collect
    failures = iter([RuntimeError("a bug")])

    def failing_once() -> Any:
        for failure in failures:
            raise failure
        return collect()

    monkeypatch.setattr(poller, "collect", failing_once)
    poller.start()
    assert poller.ready.wait(5)
    assert poller.collector_errors.get("poller") == 1
    assert "collection failed" in caplog.text
