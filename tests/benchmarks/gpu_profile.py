"""On-demand profiles on a GPU (issue 28): what a capture sees, what it costs, and the evidence of an OOM.

In one process: a 1B Llama (bf16, random weights, batch 1, greedy, 128 new tokens) instrumented, its
metrics endpoint started with ``INFERWATCH_PROFILE=1``, and requests back to back in a thread, as a
serving process has them. Through the endpoint (``inferwatch profile``'s :class:`ProfileClient`):

* **eager**: a 20-step capture; the table must hold CUDA kernels (``top_by == "device time"``), the idle
  split must say host wait dominates, the verdict must be host-bound; the serving thread's time at the
  step boundaries and the CLI's analysis time are reported;
* **compiled**: the same with a static cache (transformers compiles the decode step): the device's idle
  share must be smaller than eager's;
* **throughput cost**: generate times of requests that hold a 20-step capture against requests without,
  interleaved; and of requests during an OOM-armed period (allocator history on) against requests
  without, interleaved;
* **a real OOM while armed**: an allocation of more than the free memory; the snapshot's totals must
  agree with the allocator's at the OOM (reserved: the segments' sizes; allocated: the active blocks').

About four minutes. On the GPU machine, from the repository root (the endpoint needs uvicorn and
httptools: carried wheels there)::

    python3 tests/benchmarks/gpu_profile.py --json "$OUT/gpu_profile.json"

Exit status 0 when every check holds, 1 when one does not, 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.endpoint.server import start_http_server
from inferwatch.instrumentation.profiling.memory_evidence import MEMORY
from inferwatch.monitor.profile import ProfileClient

NEW_TOKENS = 128
PAIRS = 8
STEPS = 20


class Requests:
    """``generate`` back to back in one thread (the serving thread), each timed."""

    def __init__(self, model: torch.nn.Module, **kwargs: Any) -> None:
        self.model, self.kwargs = model, kwargs
        self.ids = torch.randint(0, 1000, (1, 32), device=model.device)
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def one(self) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        self.model.generate(
            self.ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **self.kwargs
        )
        torch.cuda.synchronize()
        return time.perf_counter() - started

    def _run(self) -> None:
        while not self._stop.is_set():
            self.times.append(self.one())

    def __enter__(self) -> Requests:
        for _ in range(2):
            self.one()  # warm (and, with a static cache, compiled)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def wait_for(self, count: int) -> None:
        """Until ``count`` requests have finished."""
        while len(self.times) < count:
            time.sleep(0.005)

    def next_times(self, count: int) -> list[float]:
        start = len(self.times)
        self.wait_for(start + count)
        return self.times[start : start + count]


def capture(client: ProfileClient, out: Path) -> dict[str, Any]:
    profiled = client.capture(STEPS, 20.0, out)
    doc = profiled.summary.to_dict()
    return {
        "state": profiled.state,
        "analysis_cpu_seconds": profiled.analysis_cpu_seconds,
        "top_by": doc["top_by"],
        "top": doc["top"][:5],
        "device_busy_ratio": doc["device_busy_ratio"],
        "idle": doc["idle"],
        "verdict": doc["verdict"],
        "phases": doc["phases"],
    }


def capture_cost(requests: Requests, client: ProfileClient, out: Path) -> dict[str, Any]:
    """Each request that held a capture against the request after it (interleaved pairs)."""
    ratios = []
    for _ in range(PAIRS):
        requests.next_times(1)  # a request just began: the capture lands in it
        running = len(requests.times)
        client.capture(STEPS, 20.0, out)
        requests.wait_for(running + 2)
        ratios.append(requests.times[running] / requests.times[running + 1])
    return {"time_ratio_median": statistics.median(ratios), "ratios": ratios}


def armed_cost(requests: Requests, directory: Path) -> dict[str, Any]:
    """A request wholly inside an OOM-armed period against one wholly outside (interleaved pairs)."""
    ratios = []
    for _ in range(PAIRS):
        requests.next_times(1)
        running = len(requests.times)
        MEMORY.arm(600, 100_000, directory, 10)
        requests.wait_for(running + 2)  # the request after the one running when armed: armed throughout
        MEMORY.disarm()
        requests.wait_for(running + 4)
        ratios.append(requests.times[running + 1] / requests.times[running + 3])
    return {"time_ratio_median": statistics.median(ratios), "ratios": ratios}


def real_oom(directory: Path) -> dict[str, Any]:
    MEMORY.arm(120, 100_000, directory, 10)
    try:
        free, _ = torch.cuda.mem_get_info()
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            torch.empty(int(free * 1.5), dtype=torch.uint8, device="cuda")
    finally:
        MEMORY.disarm()
    if not MEMORY.files:
        return {"error": "no OOM evidence written"}
    entry = MEMORY.files[-1]
    with (directory / entry["snapshot"]).open("rb") as source:
        snapshot = pickle.load(source)
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == entry["device"]]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    return {
        **entry,
        "snapshot_reserved_bytes": reserved,
        "snapshot_allocated_bytes": allocated,
        "summary_text_head": (directory / entry["summary"]).read_text()[:400],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="inferwatch-gpu-profile-"))
    os.environ.update({"INFERWATCH_PROFILE": "1", "INFERWATCH_PROFILE_DIR": str(work / "server")})
    model = build_model("llama-1b", device="cuda", dtype=torch.bfloat16)
    instrument(model)
    server = start_http_server(port=0)
    client = ProfileClient(server.url, timeout=30)
    results: dict[str, Any] = {"environment": environment()}
    try:
        with Requests(model) as requests:
            results["eager"] = capture(client, work / "cli")
            results["eager_capture_cost"] = capture_cost(requests, client, work / "cli")
            results["armed_cost"] = armed_cost(requests, work / "server")
        with Requests(model, cache_implementation="static") as requests:
            results["compiled"] = capture(client, work / "cli")
        results["oom"] = real_oom(work / "server")
    finally:
        server.close()
    eager, compiled, oom = results["eager"], results["compiled"], results["oom"]
    idle = eager["idle"] or {}
    checks = {
        "eager table holds CUDA kernels": eager["top_by"] == "device time",
        "eager idle mostly host wait": idle.get("host_wait_seconds", 0)
        > idle.get("kernel_gaps_seconds", 0) + idle.get("sync_wait_seconds", 0),
        "eager verdict host-bound": eager["verdict"] == "host-bound",
        "compiled idle share smaller": (compiled["device_busy_ratio"] or 0)
        > (eager["device_busy_ratio"] or 1),
        "OOM snapshot reserved agrees": oom.get("snapshot_reserved_bytes") == oom.get("reserved_bytes"),
        "OOM snapshot allocated agrees": oom.get("snapshot_allocated_bytes") == oom.get("allocated_bytes"),
    }
    results["checks"] = checks
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(
        f"eager: busy {eager['device_busy_ratio']:.3f}, serving thread "
        f"{eager['state']['serving_thread_seconds'] * 1e3:.1f} ms, "
        f"CLI analysis {eager['analysis_cpu_seconds']:.2f} s, "
        f"trace {eager['state']['trace_bytes']} bytes; compiled: busy {compiled['device_busy_ratio']:.3f}; "
        f"a request holding a capture: x{results['eager_capture_cost']['time_ratio_median']:.3f}; "
        f"armed: x{results['armed_cost']['time_ratio_median']:.3f}"
    )
    write_json(args.json, results)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
