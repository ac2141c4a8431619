"""Benchmark of ``inferwatch-exporter`` beside the nvidia-smi-per-scrape approach.

One run measures, on the machine it runs on:

* the time of one full poll of each GPU (every NVML collector once), as the exporter reports it in
  ``inferwatch_exporter_gpu_collect_duration_seconds``, sampled every second over the run, and the time
  per collector;
* ``/metrics`` latency p50/p99 at a steady 10 scrapes/s (a new connection per scrape, like a cold
  scraper), the exporter's CPU (% of one core) while idle and while scraped, and its resident memory;
* the same figures for an nvidia-smi-based exporter, which runs ``nvidia-smi --query-gpu=...`` on every
  scrape: the run time of that command at 10/s is both its poll and its scrape latency, its CPU that of
  the nvidia-smi processes (``wait4``), its memory the largest peak RSS of one of them (from /proc).

``--load matmul`` runs a bf16 8192x8192 matmul loop on GPU 0 in a process of its own for the whole
measurement (torch needed): polls of a GPU with a compute process on it read its per-process utilization
and its GPM counters move, the state a serving GPU is in.

``--soak`` instead scrapes at 10/s for 10 minutes and samples the exporter's RSS every 10 s, to show that
it stays flat after the first minute. The figures print as a table; ``--json PATH`` also writes them.
Usage, from the repository root on the GPU machine::

    python3 tests/benchmarks/exporter_bench.py --json exporter-bench.json
    python3 tests/benchmarks/exporter_bench.py --soak --json exporter-soak.json

Only the standard library, psutil and prometheus_client are needed; the exporter runs as
``python -m inferwatch.exporter`` with the real NVML unless ``--nvml-module`` names another binding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# What an nvidia-smi exporter asks for: the fields closest to this exporter's default catalogue. Fields
# the installed nvidia-smi does not know are dropped (it refuses the whole query otherwise).
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "pstate",
    "persistence_mode",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "temperature.memory",
    "clocks.gr",
    "clocks.sm",
    "clocks.mem",
    "clocks.video",
    "clocks.max.gr",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks_event_reasons.active",
    "pcie.link.gen.gpucurrent",
    "pcie.link.width.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
)
TARGETS = {"scrape_p99_ms": 5.0, "poll_per_gpu_ms": 10.0, "cpu_percent_idle": 1.0, "rss_mb": 60.0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def at_rate(rate: float, seconds: float, action: Callable[[], None]) -> None:
    """Call ``action`` ``rate`` times a second for ``seconds``; a slow call delays the next one."""
    period, deadline = 1 / rate, time.monotonic() + seconds
    due = time.monotonic()
    while due < deadline:
        action()
        due += period
        time.sleep(max(0.0, due - time.monotonic()))


# --- the exporter ---------------------------------------------------------------------------------------


@dataclass
class RunningExporter:
    url: str
    process: psutil.Process

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def rss(self) -> int:
        return self.process.memory_info().rss


@contextmanager
def exporter(interval: str, nvml_module: str | None, extra: list[str]) -> Iterator[RunningExporter]:
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    if nvml_module:
        env["INFERWATCH_EXPORTER_NVML_MODULE"] = nvml_module
    cmd = [sys.executable, "-m", "inferwatch.exporter", f"--web.listen-address={address}"]
    cmd += [f"--collector.interval={interval}", *extra]
    with tempfile.TemporaryFile() as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            url = f"http://{address}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    get(url + "/-/ready")
                    break
                except OSError as exc:
                    if popen.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        output = log.read().decode(errors="replace")
                        raise SystemExit(f"the exporter did not start ({exc}):\n{output}") from None
                    time.sleep(0.1)
            yield RunningExporter(url, psutil.Process(popen.pid))
        finally:
            popen.terminate()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()


#: The GPU load of ``--load matmul``: one process keeping the GPU's tensor cores busy until killed.
MATMUL_LOAD = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    a @ a
    torch.cuda.synchronize()
"""


@contextmanager
def gpu_load(kind: str | None) -> Iterator[None]:
    if kind is None:
        yield
        return
    load = subprocess.Popen([sys.executable, "-c", MATMUL_LOAD], stdout=subprocess.PIPE, text=True)
    try:
        if load.stdout is None or load.stdout.readline().strip() != "ready":
            raise SystemExit("the matmul load did not start")
        yield
    finally:
        load.kill()
        load.wait()


def measure_exporter(args: argparse.Namespace) -> dict[str, Any]:
    with gpu_load(args.load), exporter(args.interval, args.nvml_module, args.exporter_arg) as running:
        time.sleep(args.warmup)
        text = get(running.url + "/metrics")
        info = [labels for name, labels, _ in samples(text) if name == "gpu_info"]

        # Idle: polling at the interval, nobody scraping.
        cpu, started = running.cpu_seconds(), time.monotonic()
        time.sleep(args.idle)
        idle_cpu = 100 * (running.cpu_seconds() - cpu) / (time.monotonic() - started)

        # Scraped at the rate, a new connection each time; poll durations read once a second.
        latencies: list[float] = []
        poll_ms: dict[str, list[float]] = defaultdict(list)
        collector_ms: dict[str, list[float]] = defaultdict(list)
        last_seen = {"t": 0.0}
        rss_peak = running.rss()

        def scrape() -> None:
            nonlocal rss_peak
            t0 = time.perf_counter()
            body = get(running.url + "/metrics")
            latencies.append(time.perf_counter() - t0)
            now = time.monotonic()
            if now - last_seen["t"] >= 1.0:
                last_seen["t"] = now
                rss_peak = max(rss_peak, running.rss())
                for name, labels, value in samples(body):
                    if name == "inferwatch_exporter_gpu_collect_duration_seconds":
                        poll_ms[labels["gpu"]].append(value * 1e3)
                    elif name == "inferwatch_exporter_collector_duration_seconds":
                        collector_ms[labels["collector"]].append(value * 1e3)

        cpu, started = running.cpu_seconds(), time.monotonic()
        at_rate(args.rate, args.duration, scrape)
        scraped_cpu = 100 * (running.cpu_seconds() - cpu) / (time.monotonic() - started)

    gpus = max(len(info), 1)
    return {
        "gpus": [
            {k: v for k, v in labels.items() if k in ("gpu", "name", "driver_version")} for labels in info
        ],
        "poll_per_gpu_ms": {
            gpu: {"p50": percentile(v, 50), "p90": percentile(v, 90), "p99": percentile(v, 99), "max": max(v)}
            for gpu, v in poll_ms.items()
        },
        "collector_ms_per_gpu": {name: statistics.mean(v) / gpus for name, v in sorted(collector_ms.items())},
        "scrapes": len(latencies),
        "scrape_ms": {"p50": percentile(latencies, 50) * 1e3, "p99": percentile(latencies, 99) * 1e3},
        "cpu_percent_idle": idle_cpu,
        "cpu_percent_scraped": scraped_cpu,
        "rss_mb": rss_peak / MIB,
        "metrics_lines": len(text.splitlines()),
    }


# --- nvidia-smi per scrape ------------------------------------------------------------------------------


def smi_fields(smi: str) -> list[str]:
    help_text = subprocess.run([smi, "--help-query-gpu"], capture_output=True, text=True, timeout=60).stdout
    return [field for field in SMI_FIELDS if f'"{field}"' in help_text]


def high_water_kib(pid: int) -> int:
    """VmHWM of a running process, in KiB; 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure_nvidia_smi(args: argparse.Namespace) -> dict[str, Any] | str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi not found: comparison skipped"
    fields = smi_fields(smi)
    cmd = [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    latencies: list[float] = []
    cpu_seconds: list[float] = []
    rss_kib: list[int] = []

    def scrape() -> None:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak_kib = 0
        while True:
            # wait4's ru_maxrss would include this Python process's RSS, inherited before exec; the
            # high-water mark of nvidia-smi's own memory is read from /proc while it runs instead.
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak_kib = max(peak_kib, high_water_kib(child.pid))
            time.sleep(0.001)
        child.returncode = os.waitstatus_to_exitcode(status)
        latencies.append(time.perf_counter() - t0)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited with {child.returncode}")
        cpu_seconds.append(usage.ru_utime + usage.ru_stime)
        rss_kib.append(peak_kib)

    started = time.monotonic()
    at_rate(args.rate, args.smi_duration, scrape)
    wall = time.monotonic() - started
    return {
        "fields": len(fields),
        "scrapes": len(latencies),
        "scrape_ms": {"p50": percentile(latencies, 50) * 1e3, "p99": percentile(latencies, 99) * 1e3},
        "cpu_percent_scraped": 100 * sum(cpu_seconds) / wall,
        "rss_mb": max(rss_kib) * 1024 / MIB,
    }


# --- soak -----------------------------------------------------------------------------------------------


def soak(args: argparse.Namespace) -> dict[str, Any]:
    with exporter(args.interval, args.nvml_module, args.exporter_arg) as running:
        time.sleep(args.warmup)
        points: list[tuple[float, float]] = []
        errors = 0
        started = time.monotonic()

        def scrape() -> None:
            nonlocal errors
            try:
                get(running.url + "/metrics")
            except OSError:
                errors += 1
            elapsed = time.monotonic() - started
            if not points or elapsed - points[-1][0] >= 10:
                points.append((elapsed, running.rss() / MIB))

        at_rate(args.rate, args.soak_seconds, scrape)
    # The first minute is warm-up (allocator pools, first encodings); flat means no growth after it.
    settled = [p for p in points if p[0] >= 60] or points
    xs, ys = [p[0] / 60 for p in settled], [p[1] for p in settled]
    slope = statistics.linear_regression(xs, ys).slope if len(settled) > 2 else 0.0
    return {
        "seconds": args.soak_seconds,
        "errors": errors,
        "rss_mb": {
            "start": points[0][1],
            "settled": ys[0],
            "last": ys[-1],
            "max": max(ys),
            "slope_mb_per_min": slope,
        },
        "flat": ys[-1] - ys[0] < 2.0 and slope < 0.1,
        "rss_samples": [[round(x, 1), round(y, 2)] for x, y in points],
    }


# --- report ---------------------------------------------------------------------------------------------


def print_table(result: dict[str, Any]) -> None:
    ours, smi = result["exporter"], result["nvidia_smi"]
    polls = ours["poll_per_gpu_ms"]
    poll = " ".join(f"gpu{g}: {v['p50']:.2f}/{v['p99']:.2f}" for g, v in sorted(polls.items())) or "no GPU"
    rows = [
        ("poll of one GPU p50/p99 (ms)", poll, "= one scrape (all GPUs)"),
        (
            f"scrape p50 / p99 (ms) at {result['rate']:g}/s",
            f"{ours['scrape_ms']['p50']:.2f} / {ours['scrape_ms']['p99']:.2f}",
            f"{smi['scrape_ms']['p50']:.2f} / {smi['scrape_ms']['p99']:.2f}"
            if isinstance(smi, dict)
            else smi,
        ),
        (
            f"CPU % of a core, idle ({result['interval']} polls)",
            f"{ours['cpu_percent_idle']:.2f}",
            "0 (nothing runs between scrapes)",
        ),
        (
            f"CPU % of a core, scraped at {result['rate']:g}/s",
            f"{ours['cpu_percent_scraped']:.2f}",
            f"{smi['cpu_percent_scraped']:.2f}" if isinstance(smi, dict) else "-",
        ),
        (
            "RSS (MB)",
            f"{ours['rss_mb']:.1f}",
            f"{smi['rss_mb']:.1f} (largest run)" if isinstance(smi, dict) else "-",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'':<{width}}  {'inferwatch-exporter':<32}  nvidia-smi per scrape")
    for label, a, b in rows:
        print(f"{label:<{width}}  {a:<32}  {b}")
    print(
        "\ntime per collector and GPU (ms, mean): "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in ours["collector_ms_per_gpu"].items())
    )
    worst_poll = max((v["p99"] for v in polls.values()), default=0.0)
    checks = {
        "scrape_p99_ms": ours["scrape_ms"]["p99"],
        "poll_per_gpu_ms": worst_poll,
        "cpu_percent_idle": ours["cpu_percent_idle"],
        "rss_mb": ours["rss_mb"],
    }
    verdicts = []
    for key, value in checks.items():
        met = value < TARGETS[key]
        verdicts.append(
            f"{key} {value:.2f} {'<' if met else '>='} {TARGETS[key]:g} ({'met' if met else 'MISSED'})"
        )
    print("targets: " + ", ".join(verdicts))


def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for distribution in ("inferwatch", "prometheus-client", "nvidia-ml-py", "psutil"):
        try:
            versions[distribution] = version(distribution)
        except PackageNotFoundError:
            versions[distribution] = "not installed"
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "versions": versions,
        "command": " ".join(sys.argv),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", default="1s", help="the exporter's poll interval (default 1s)")
    parser.add_argument("--rate", type=float, default=10.0, help="scrapes per second (default 10)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of scraping the exporter")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of measuring idle CPU")
    parser.add_argument("--smi-duration", type=float, default=30.0, help="seconds of nvidia-smi scrapes")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after start before measuring")
    parser.add_argument("--soak", action="store_true", help="run the RSS soak instead")
    parser.add_argument("--soak-seconds", type=float, default=600.0, help="length of the soak (default 600)")
    parser.add_argument("--nvml-module", help="NVML binding for the exporter (default: pynvml)")
    parser.add_argument("--load", choices=["matmul"], help="a GPU load while measuring (default: none)")
    parser.add_argument(
        "--exporter-arg", action="append", default=[], help="extra exporter flag (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    result: dict[str, Any] = {
        **environment(),
        "rate": args.rate,
        "interval": args.interval,
        "load": args.load,
    }
    if args.soak:
        result["soak"] = soak(args)
        rss = result["soak"]["rss_mb"]
        print(
            f"soak {args.soak_seconds:g}s at {args.rate:g} scrapes/s: RSS at start {rss['start']:.1f} MB, "
            f"after 1 min {rss['settled']:.1f} MB, last {rss['last']:.1f} MB, max {rss['max']:.1f} MB, "
            f"slope {rss['slope_mb_per_min']:+.3f} MB/min, errors {result['soak']['errors']}: "
            f"{'flat' if result['soak']['flat'] else 'NOT flat'}"
        )
    else:
        result["exporter"] = measure_exporter(args)
        result["nvidia_smi"] = measure_nvidia_smi(args)
        print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
