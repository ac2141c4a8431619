"""The exporter's GPM figures beside what workloads of known character imply, on a real GPU.

Two exporters run side by side on the real NVML, 1 s polls: one as shipped (GPM on, 1 s window) and one
with ``--no-collector.gpm``, the alternative without profiling figures. The GPM one is scraped every
0.25 s while this process puts workloads on the first CUDA device, one after the other:

* **idle**: nothing runs; SM, tensor and DRAM activity should be about 0 (under 5 %);
* **matmul**: a bf16 8192² matmul loop; the tensor cores should be busy (over 80 %); TFLOP/s achieved;
* **copy**: device-to-device copies of a large buffer; DRAM activity should be within 10 points of the
  bytes moved per second (read + write) over the GPU's peak bandwidth (NVML: bus width x max memory
  clock x 2);
* **host-bound**: a Python loop of 128² matmuls; NVML utilization should be far above SM activity (4x);
* **two processes**: two child processes with memory on the GPU, one running the matmul loop and one
  idle; per-process SM utilization should tell them apart (busy over 50 %, idle under 5 %).

Throughout, every poll's duration per GPU is read from both exporters (target with GPM on: p99 under
10 ms), and each exporter's CPU is measured over 20 s of idle with nobody scraping (target: under 1 % of
a core). Readings of a phase are taken after it has run 3.5 s (a GPM window of 1 s, NVML's utilization
means over three polls), their median reported. About 2 minutes. On the GPU machine, from the
repository root::

    python3 tests/benchmarks/gpu_gpm.py --json "$OUT/gpu_gpm.json"

Exit status 0 when every target is met, 1 when one is missed (the JSON says which), 2 when there is no
CUDA GPU, or its GPU has no GPM.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exporter_bench import RunningExporter, exporter, get, percentile, samples

GIB = 1 << 30
SETTLE_SECONDS = 3.5
PHASE_SECONDS = 12.0
IDLE_CPU_SECONDS = 20.0
SCRAPE_PERIOD = 0.25
TARGETS = {
    "idle_activity_below": 0.05,
    "matmul_tensor_above": 0.8,
    "copy_dram_points_within": 0.10,
    "host_bound_utilization_over_sm_at_least": 4.0,
    "busy_process_above": 0.5,
    "idle_process_below": 0.05,
    "poll_p99_ms_below": 10.0,
    "idle_cpu_percent_below": 1.0,
}
# (key in the readings, metric, extra labels): the GPU's figures, whole GPU for the GPM ones.
GPU_READINGS = (
    ("nvml_utilization", "gpu_utilization_ratio", {}),
    ("nvml_memory_utilization", "gpu_memory_bandwidth_utilization_ratio", {}),
    ("sm_active", "gpu_sm_active_ratio", {"gpu_instance": ""}),
    ("sm_occupancy", "gpu_sm_occupancy_ratio", {"gpu_instance": ""}),
    ("tensor_active", "gpu_tensor_active_ratio", {"gpu_instance": ""}),
    ("dram_active", "gpu_dram_active_ratio", {"gpu_instance": ""}),
    ("fp16_active", "gpu_fp16_active_ratio", {"gpu_instance": ""}),
    ("fp32_active", "gpu_fp32_active_ratio", {"gpu_instance": ""}),
    ("fp64_active", "gpu_fp64_active_ratio", {"gpu_instance": ""}),
    ("pcie_tx_bytes_per_second", "gpu_pcie_tx_bytes_per_second", {}),
    ("pcie_rx_bytes_per_second", "gpu_pcie_rx_bytes_per_second", {}),
)


@dataclass
class Recorder:
    """Scrapes an exporter in the background: the readings of one GPU during each phase, and the
    duration of every poll of every GPU (each poll once, by its finishing time)."""

    exporter: RunningExporter
    uuid: str
    readings: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    poll_ms: dict[str, list[float]] = field(default_factory=dict)
    gpm_collector_ms: list[float] = field(default_factory=list)  # per collection, all GPUs
    phase: str | None = None
    _phase_started: float = 0.0
    _seen_polls: set[tuple[str, float]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(SCRAPE_PERIOD):
            if not self._paused.is_set():
                self._record(get(self.exporter.url + "/metrics"))

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._paused.set()
        try:
            yield
        finally:
            self._paused.clear()

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        with self._lock:
            self.phase, self._phase_started = phase, time.monotonic()
            self.readings[phase] = []
        try:
            yield
        finally:
            with self._lock:
                self.phase = None

    def stop(self) -> None:
        self._stop.set()

    def _record(self, text: str) -> None:
        parsed = list(samples(text))
        durations = {lab["gpu"]: v for name, lab, v in parsed if name == _POLL_DURATION}
        for name, labels, finished in parsed:
            if name == _POLL_FINISHED and (labels["gpu"], finished) not in self._seen_polls:
                self._seen_polls.add((labels["gpu"], finished))
                self.poll_ms.setdefault(labels["gpu"], []).append(durations[labels["gpu"]] * 1e3)
            elif name == _COLLECTION_FINISHED and ("", finished) not in self._seen_polls:
                self._seen_polls.add(("", finished))
                gpm = [v for n, lab, v in parsed if n == _COLLECTOR_DURATION and lab["collector"] == "gpm"]
                self.gpm_collector_ms.extend(v * 1e3 for v in gpm)
        with self._lock:
            if self.phase is None or time.monotonic() - self._phase_started < SETTLE_SECONDS:
                return
            reading: dict[str, float] = {}
            for key, metric, extra in GPU_READINGS:
                wanted = {"uuid": self.uuid, **extra}.items()
                found = [v for n, lab, v in parsed if n == metric and wanted <= lab.items()]
                if found:
                    reading[key] = found[0]
            for name, labels, value in parsed:
                if name == "gpu_process_sm_utilization_ratio" and labels.get("uuid") == self.uuid:
                    reading[f"process_sm:{labels['pid']}"] = value
            self.readings[self.phase].append(reading)

    def medians(self, phase: str) -> dict[str, float]:
        keys = {key for reading in self.readings[phase] for key in reading}
        return {
            key: statistics.median(r[key] for r in self.readings[phase] if key in r) for key in sorted(keys)
        }


_POLL_DURATION = "inferwatch_exporter_gpu_collect_duration_seconds"
_POLL_FINISHED = "inferwatch_exporter_gpu_last_collect_timestamp_seconds"
_COLLECTOR_DURATION = "inferwatch_exporter_collector_duration_seconds"  # summed over GPUs
_COLLECTION_FINISHED = "inferwatch_exporter_last_collect_timestamp_seconds"


# --- workloads: each runs until its deadline and returns what it implies ------------------------------


def run_until(seconds: float, step: Callable[[], None]) -> tuple[int, float]:
    """Call ``step`` (which ends with a synchronize) until ``seconds`` have passed: (calls, elapsed)."""
    import torch

    torch.cuda.synchronize()
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        step()
        calls += 1
    return calls, time.perf_counter() - started


def matmul(seconds: float) -> dict[str, float]:
    import torch

    n, per_step = 8192, 10
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(a)

    def step() -> None:
        for _ in range(per_step):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()

    calls, elapsed = run_until(seconds, step)
    return {"tflops_achieved": 2 * n**3 * per_step * calls / elapsed / 1e12}


def copy(seconds: float, peak_bandwidth: float) -> dict[str, float]:
    import torch

    free, _ = torch.cuda.mem_get_info()
    size = min(4 * GIB, free // 4)
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    per_step = 8

    def step() -> None:
        for _ in range(per_step):
            dst.copy_(src)
        torch.cuda.synchronize()

    calls, elapsed = run_until(seconds, step)
    moved = 2 * size * per_step * calls / elapsed  # every byte copied is read once and written once
    return {
        "buffer_gib": size / GIB,
        "bytes_per_second_achieved": moved,
        "peak_bytes_per_second": peak_bandwidth,
        "implied_dram_active": moved / peak_bandwidth,
    }


def host_bound(seconds: float) -> dict[str, float]:
    import torch

    a, b = (torch.randn(128, 128, device="cuda") for _ in range(2))
    out = torch.empty_like(a)

    def step() -> None:
        for _ in range(16):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()

    calls, elapsed = run_until(seconds, step)
    return {"kernels_per_second": 16 * calls / elapsed}


def child(role: str, seconds: float) -> None:
    """A second process on the GPU: holds 512 MiB and either runs the matmul loop or sleeps."""
    import torch

    held = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    print("ready", flush=True)
    if role == "busy":
        matmul(seconds)
    else:
        time.sleep(seconds)
    del held


@contextmanager
def two_processes(seconds: float) -> Iterator[dict[str, int]]:
    """A busy and an idle child process, both on the GPU; yields once both hold their memory."""
    with ExitStack() as stack:
        pids = {}
        for role in ("busy", "idle"):
            cmd = [sys.executable, __file__, "--child", role, "--child-seconds", str(seconds)]
            popen = stack.enter_context(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            pids[role] = popen
        for role, popen in pids.items():
            if popen.stdout is None or popen.stdout.readline().strip() != "ready":
                raise SystemExit(f"the {role} child process did not start")
        yield {role: popen.pid for role, popen in pids.items()}
        for popen in pids.values():
            popen.wait(timeout=seconds + 60)


# --- the run ---------------------------------------------------------------------------------------------


def gpu_identity() -> tuple[str, float, bool]:
    """UUID of CUDA device 0 as NVML writes it, its peak memory bandwidth, and whether it has GPM."""
    import pynvml
    import torch

    pynvml.nvmlInit()
    try:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(0).uuid}")
        except (pynvml.NVMLError, AttributeError):  # a torch without .uuid: CUDA's device 0 is NVML's 0
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        memory_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        try:
            gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except pynvml.NVMLError:
            gpm = False
    finally:
        pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    return uuid, bus_bits / 8 * memory_mhz * 1e6 * 2, gpm


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    uuid, peak_bandwidth, gpm = gpu_identity()
    if not gpm:
        raise SystemExit(f"{torch.cuda.get_device_name(0)} ({uuid}) has no NVML GPM: nothing to measure")
    torch.ones(1, device="cuda")  # this process's CUDA context, before any exporter starts
    with (
        exporter("1s", None, []) as with_gpm,
        exporter("1s", None, ["--no-collector.gpm"]) as without_gpm,
    ):
        recorders = {"gpm": Recorder(with_gpm, uuid), "no_gpm": Recorder(without_gpm, uuid)}
        threads = [threading.Thread(target=r.run, daemon=True) for r in recorders.values()]
        for thread in threads:
            thread.start()
        time.sleep(3)  # the first GPM window closes

        idle_cpu = {}
        with recorders["gpm"].paused(), recorders["no_gpm"].paused():
            before = {name: (r.exporter.cpu_seconds(), time.monotonic()) for name, r in recorders.items()}
            time.sleep(IDLE_CPU_SECONDS)
            for name, r in recorders.items():
                cpu, started = before[name]
                idle_cpu[name] = 100 * (r.exporter.cpu_seconds() - cpu) / (time.monotonic() - started)

        recorder = recorders["gpm"]
        implied: dict[str, dict[str, Any]] = {}
        with recorder.during("idle"):
            time.sleep(PHASE_SECONDS)
        implied["idle"] = {"activity": 0.0}
        with recorder.during("matmul"):
            implied["matmul"] = matmul(PHASE_SECONDS)
        with recorder.during("copy"):
            implied["copy"] = copy(PHASE_SECONDS, peak_bandwidth)
        torch.cuda.empty_cache()
        with recorder.during("host_bound"):
            implied["host_bound"] = host_bound(PHASE_SECONDS)
        with two_processes(PHASE_SECONDS + SETTLE_SECONDS) as pids, recorder.during("two_processes"):
            time.sleep(PHASE_SECONDS + SETTLE_SECONDS)
        implied["two_processes"] = {"busy_pid": pids["busy"], "idle_pid": pids["idle"]}
        for r in recorders.values():
            r.stop()
        for thread in threads:
            thread.join(timeout=5)

    readings = {phase: recorder.medians(phase) for phase in recorder.readings}
    polls = {
        name: {
            gpu: {"polls": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99), "max": max(v)}
            for gpu, v in r.poll_ms.items()
        }
        for name, r in recorders.items()
    }
    gpm_ms = recorder.gpm_collector_ms
    return {
        "gpu_uuid": uuid,
        "readings_per_phase": {phase: len(recorder.readings[phase]) for phase in recorder.readings},
        "exporter_readings": readings,
        "workload_implies": implied,
        "poll_ms_per_gpu": polls,
        "gpm_collector_ms": {"p50": percentile(gpm_ms, 50), "p99": percentile(gpm_ms, 99)}
        if gpm_ms
        else None,
        "idle_cpu_percent": idle_cpu,
        "checks": checks(readings, implied, polls, idle_cpu),
    }


def checks(
    readings: dict[str, dict[str, float]],
    implied: dict[str, dict[str, Any]],
    polls: dict[str, dict[str, dict[str, float]]],
    idle_cpu: dict[str, float],
) -> dict[str, bool]:
    """Each target of the module docstring, met or not."""
    idle, mm, cp, hb = (readings[p] for p in ("idle", "matmul", "copy", "host_bound"))
    procs = readings["two_processes"]
    busy = procs.get(f"process_sm:{implied['two_processes']['busy_pid']}", -1.0)
    idle_proc = procs.get(f"process_sm:{implied['two_processes']['idle_pid']}", 1.0)
    return {
        "idle: SM, tensor and DRAM activity about 0": all(
            idle.get(k, 1.0) < TARGETS["idle_activity_below"]
            for k in ("sm_active", "tensor_active", "dram_active")
        ),
        "matmul: tensor cores busy": mm.get("tensor_active", 0.0) > TARGETS["matmul_tensor_above"],
        "copy: DRAM activity matches bytes moved / peak": abs(
            cp.get("dram_active", -1.0) - implied["copy"]["implied_dram_active"]
        )
        <= TARGETS["copy_dram_points_within"],
        "host-bound: NVML utilization far above SM activity": hb.get("nvml_utilization", 0.0)
        >= TARGETS["host_bound_utilization_over_sm_at_least"] * hb.get("sm_active", 1.0),
        "two processes: per-process SM utilization tells them apart": busy > TARGETS["busy_process_above"]
        and idle_proc < TARGETS["idle_process_below"],
        "poll p99 under 10 ms per GPU with GPM on": all(
            gpu["p99"] < TARGETS["poll_p99_ms_below"] for gpu in polls["gpm"].values()
        ),
        "idle CPU under 1 % of a core with GPM on": idle_cpu["gpm"] < TARGETS["idle_cpu_percent_below"],
    }


def print_summary(result: dict[str, Any]) -> None:
    print(f"GPU {result['gpu_uuid']}")
    print("| phase | NVML util | SM active | occupancy | tensor | DRAM | what the workload implies |")
    print("|---|---|---|---|---|---|---|")
    for phase, reading in result["exporter_readings"].items():
        cells = [reading.get(k) for k in ("nvml_utilization", "sm_active", "sm_occupancy", "tensor_active")]
        cells.append(reading.get("dram_active"))
        shown = " | ".join("-" if c is None else f"{c:.1%}" for c in cells)
        print(f"| {phase} | {shown} | {result['workload_implies'].get(phase)} |")
    procs = result["exporter_readings"].get("two_processes", {})
    print("per-process SM utilization:", {k: v for k, v in procs.items() if k.startswith("process_sm:")})
    print("poll ms per GPU:", result["poll_ms_per_gpu"])
    print("gpm collector ms:", result["gpm_collector_ms"])
    print("idle CPU % of a core:", result["idle_cpu_percent"])
    for check, met in result["checks"].items():
        print(f"{'met   ' if met else 'MISSED'} {check}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--child", choices=("busy", "idle"), help=argparse.SUPPRESS)
    parser.add_argument("--child-seconds", type=float, default=PHASE_SECONDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.child_seconds)
        return 0
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("gpu_gpm.py needs a CUDA GPU with NVML (and torch with CUDA): none here", file=sys.stderr)
        return 2
    try:
        result = measure(args)
    except SystemExit as exc:
        print(f"gpu_gpm.py: {exc}", file=sys.stderr)
        return 2
    print_summary(result)
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
