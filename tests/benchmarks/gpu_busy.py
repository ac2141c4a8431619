"""``llm_gpu_busy_ratio`` beside the profiler's kernel intervals, and what ``diagnose`` makes of it, on a GPU.

The truth is ``torch.profiler``'s CUDA activity over a window of the workload: the union of the kernel
intervals over the window's wall time (kernel-busy share). In the same window, the instrumented process
publishes its busy ratio (1 s polls); its readings from one poll into the window to its end are compared
with the truth. Workloads, one after the other, in this process:

* **eager**: a 1B Llama (bf16) decoding with batch 1 and no static cache: host-bound (the GPU waits for
  Python between kernels). Alone on the GPU (``source="device"``), then beside an idle second process
  holding a CUDA context (``source="process"``: NVML's per-process share);
* **gpu-bound**: an 8B Llama-3-shaped model (bf16, random weights) prefilling 8192 tokens per request,
  back to back.

Targets (issue 24): eager reads at most 0.3 and within 0.15 of the truth, from either source; GPU-bound
reads at least 0.7. ``inferwatch diagnose --endpoint`` (the process's endpoint and an exporter's) calls the
eager loop host-bound with the exporter's GPM on and with it off, and does not call the GPU-bound load
host-bound. Also measured: what one busy reading costs the NVML poller (both sources), and the forward
passes' share of the wall time (``llm_forward_time_ratio``, what the busy ratio used to be). About three
minutes. On the GPU machine, from the repository root (the exporter and the endpoint need uvicorn and
httptools: carried wheels there)::

    python3 tests/benchmarks/gpu_busy.py --json "$OUT/gpu_busy.json"

Exit status 0 when every target is met, 1 when one is missed, 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json
from exporter_bench import exporter, get
from inferwatch.instrumentation import InstrumentConfig, instrument
from inferwatch.instrumentation.demo.models import build_config
from inferwatch.instrumentation.device.busy import BusyMeter
from inferwatch.instrumentation.endpoint.server import start_http_server
from prometheus_client import CollectorRegistry

TARGETS = {"eager_at_most": 0.3, "eager_within": 0.15, "gpu_bound_at_least": 0.7}
POLL_SECONDS = 1.0
SETTLE_SECONDS = 4.0  # the workload runs this long before its window: compiled, warm, a poll behind
WINDOW_SECONDS = 8.0
LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=16384,
    rope_theta=500000.0,
)


def build(config: Any) -> torch.nn.Module:
    """Random bf16 weights made on the GPU (seconds, where building on the CPU takes minutes for 8B)."""
    import transformers

    with torch.device("cuda"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


class Loop:
    """Calls ``step`` back to back in a thread until stopped."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._step = step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._step()

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        torch.cuda.synchronize()


def kernel_busy_share(trace_path: str, wall_seconds: float) -> tuple[float, int]:
    """Union of the CUDA kernel intervals of a Chrome trace over ``wall_seconds``; and the kernel count."""
    with open(trace_path, encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
    busy_us, current = 0.0, None
    for start, end in intervals:
        if current is None or start > current[1]:
            if current is not None:
                busy_us += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        busy_us += current[1] - current[0]
    return busy_us / 1e6 / wall_seconds, len(intervals)


def gauge(registry: CollectorRegistry, name: str, model: str) -> tuple[float | None, str | None]:
    """A model's gauge and its ``source`` label, if any."""
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                return sample.value, sample.labels.get("source")
    return None, None


def window(registry: CollectorRegistry, model: str) -> dict[str, Any]:
    """The profiler's kernel-busy share over WINDOW_SECONDS, and the busy readings published meanwhile."""
    readings: list[tuple[float, float, str | None]] = []
    forward_time: list[float] = []
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(activities=activities) as profile:
            started = time.perf_counter()
            while (now := time.perf_counter()) - started < WINDOW_SECONDS:
                busy, source = gauge(registry, "llm_gpu_busy_ratio", model)
                spans, _ = gauge(registry, "llm_forward_time_ratio", model)
                # A reading covers the poll before it (and the model poller publishes up to a poll later).
                if now - started >= 2 * POLL_SECONDS and busy is not None:
                    readings.append((now - started, busy, source))
                    forward_time.append(spans or 0.0)
                time.sleep(0.25)
            wall = time.perf_counter() - started
        trace = str(Path(tmp) / "trace.json")
        profile.export_chrome_trace(trace)
        truth, kernels = kernel_busy_share(trace, wall)
    values = [value for _, value, _ in readings]
    return {
        "kernel_busy_share": truth,
        "kernels": kernels,
        "busy_median": statistics.median(values) if values else None,
        "busy_min": min(values, default=None),
        "busy_max": max(values, default=None),
        "sources": sorted({source for _, _, source in readings if source}),
        "forward_time_median": statistics.median(forward_time) if forward_time else None,
        "readings": readings,
    }


@contextmanager
def idle_neighbour() -> Iterator[None]:
    """A second process holding a CUDA context on the GPU, doing nothing."""
    code = (
        "import sys, time, torch; torch.ones(1, device='cuda'); print('ready', flush=True); time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(2 * POLL_SECONDS)  # listed by NVML from the next poll on
        yield
    finally:
        child.kill()
        child.wait()


def diagnose(endpoint: str, exporter_url: str) -> dict[str, Any]:
    """``inferwatch diagnose`` over the two endpoints: which checks found what."""
    command = [
        sys.executable, "-m", "inferwatch.cli", "diagnose", "--endpoint", endpoint,
        "--endpoint", exporter_url.removeprefix("http://"), "--samples", "5", "--interval", "1.5", "--json",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {"error": f"exit {result.returncode}: {result.stderr[-2000:]}"}
    return {
        "findings": sorted({f["check"] for f in report["findings"]}),
        "host_bound": [f["summary"] for f in report["findings"] if f["check"] == "host-bound"],
        "host_bound_evidence": [
            (e["what"], e["value"])
            for f in report["findings"]
            if f["check"] == "host-bound"
            for e in f["evidence"]
        ],
        "not_assessed": report["not_assessed"],
    }


def reading_cost(repeats: int = 20) -> dict[str, float]:
    """Milliseconds one busy reading takes (the NVML calls of a poll), for each source."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    listed = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    meter = BusyMeter(pynvml, handle)
    cost: dict[str, float] = {}
    for source, pids in (("device", {next(iter(meter.own))}), ("process", {next(iter(meter.own)), -1})):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            meter.read(pids if source == "process" else listed)
            times.append((time.perf_counter() - started) * 1e3)
            time.sleep(0.05)
        cost[f"{source}_ms_median"] = statistics.median(times)
    return cost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_busy: no CUDA GPU", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    config = InstrumentConfig(poll_interval_seconds=POLL_SECONDS)
    results: dict[str, Any] = {"environment": environment(), "targets": TARGETS}
    server = start_http_server(port=0, registry=registry)
    endpoint = f"127.0.0.1:{server.port}"

    small = build(build_config("llama-1b"))
    instrument(small, model_name="llama-1b", registry=registry, config=config)
    ids = torch.randint(0, 1000, (1, 32), device="cuda")
    mask = torch.ones_like(ids)

    def decode() -> None:
        small.generate(ids, attention_mask=mask, max_new_tokens=64, min_new_tokens=64, do_sample=False)

    with exporter("1s", None, []) as gpm_on, exporter("1s", None, ["--no-collector.gpm"]) as gpm_off:
        with Loop(decode):
            time.sleep(SETTLE_SECONDS)
            results["eager"] = window(registry, "llama-1b")
            results["eager_diagnose_gpm_on"] = diagnose(endpoint, gpm_on.url)
            results["eager_diagnose_gpm_off"] = diagnose(endpoint, gpm_off.url)
            with idle_neighbour():
                results["eager_beside_a_neighbour"] = window(registry, "llama-1b")
        results["reading_cost"] = reading_cost()

        large = build(transformers_config(LLAMA_8B))
        instrument(large, model_name="llama-8b", registry=registry, config=config)
        long_ids = torch.randint(0, 1000, (1, 8192), device="cuda")
        long_mask = torch.ones_like(long_ids)

        def prefill() -> None:
            large.generate(long_ids, attention_mask=long_mask, max_new_tokens=1, do_sample=False)

        with Loop(prefill):
            time.sleep(SETTLE_SECONDS)
            results["gpu_bound"] = window(registry, "llama-8b")
            results["gpu_bound_diagnose_gpm_on"] = diagnose(endpoint, gpm_on.url)
            results["gpu_bound_diagnose_gpm_off"] = diagnose(endpoint, gpm_off.url)
        results["exporter_gpm_sample"] = [
            line
            for line in get(gpm_on.url + "/metrics").splitlines()
            if line.startswith("gpu_sm_active_ratio")
        ]
    server.close()

    checks = judge(results)
    results["checks"] = checks
    write_json(args.json, results)
    for name in ("eager", "eager_beside_a_neighbour", "gpu_bound"):
        r = results[name]
        print(
            f"{name}: profiler kernel-busy {r['kernel_busy_share']:.3f} ({r['kernels']} kernels), "
            f"llm_gpu_busy_ratio median {r['busy_median']} [{r['busy_min']}, {r['busy_max']}] "
            f"{r['sources']}, "
            f"forward time {r['forward_time_median']}"
        )
    for name in ("eager", "gpu_bound"):
        for gpm in ("on", "off"):
            print(f"diagnose {name}, GPM {gpm}: {results[f'{name}_diagnose_gpm_{gpm}']}")
    print("reading cost:", results["reading_cost"])
    print("checks:", checks)
    return 0 if all(checks.values()) else 1


def transformers_config(fields: dict[str, Any]) -> Any:
    import transformers

    return transformers.LlamaConfig(**fields, tie_word_embeddings=False)


def judge(results: dict[str, Any]) -> dict[str, bool]:
    checks: dict[str, bool] = {}
    for name, source in (("eager", "device"), ("eager_beside_a_neighbour", "process")):
        r = results[name]
        busy = r["busy_median"]
        if not r["kernels"]:
            # On the H200 the profiler recorded no kernel in the window beside the neighbour (its second
            # session in the process, another process on the GPU): the truth is then the same workload's
            # share measured alone just before, and the results say so.
            r["kernel_busy_share"], r["truth"] = results["eager"]["kernel_busy_share"], "the eager window's"
        checks[f"{name}: a reading"] = busy is not None and r["sources"] == [source]
        checks[f"{name}: at most {TARGETS['eager_at_most']}"] = (
            busy is not None and busy <= TARGETS["eager_at_most"]
        )
        checks[f"{name}: within {TARGETS['eager_within']} of the profiler"] = (
            busy is not None and abs(busy - r["kernel_busy_share"]) <= TARGETS["eager_within"]
        )
    busy = results["gpu_bound"]["busy_median"]
    checks[f"gpu_bound: at least {TARGETS['gpu_bound_at_least']}"] = (
        busy is not None and busy >= TARGETS["gpu_bound_at_least"]
    )
    for gpm in ("on", "off"):
        eager, bound = results[f"eager_diagnose_gpm_{gpm}"], results[f"gpu_bound_diagnose_gpm_{gpm}"]
        checks[f"diagnose, GPM {gpm}: eager host-bound"] = "host-bound" in eager.get("findings", [])
        checks[f"diagnose, GPM {gpm}: GPU-bound not host-bound"] = (
            "error" not in bound
            and "host-bound" not in bound["findings"]
            and "host-bound" not in bound["not_assessed"]
        )
    return checks


if __name__ == "__main__":
    sys.exit(main())
