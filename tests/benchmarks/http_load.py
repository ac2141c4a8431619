"""inferwatch's two metrics endpoints under the loads of issue 15, optionally beside an older release.

``exporter``: ``inferwatch-exporter`` over the NVML stand-in (8 GPUs), or the machine's GPUs through the
real NVML with ``--real-nvml``, at 1 s polls with the timeout following the interval (as deployed),
scraped by

* one keep-alive connection back to back (Nagle's ~40 ms shows here), and over TLS, kept alive and
  a new connection per scrape;
* 200 keep-alive scrapers, one scrape a second each, then 200 back to back, for 20 s each, while a
  probe reads every half second whether any GPU is served as down (``gpu_up 0``) or counted hung;
* 1000 connections trickling a request head one byte every 10 s, then 1000 silent ones, for 40 s each,
  beside a probe scraping 5 times a second on new connections: threads, RSS, probe latency, and when
  the server closed the slow ones.

``signals``: the exporter started, loaded by 200 keep-alive scrapers back to back, and stopped by SIGTERM
or SIGINT (alternating), ``--tries`` times: exit status, seconds to exit, port free afterwards.

``instrumentation``: a serving loop in a process of its own (small-llama, instrumented, one torch thread,
greedy requests of 32 prompt and 32 new tokens without pause, metrics on ``start_http_server``), scraped
with Prometheus' request headers (gzip accepted), its tokens/s measured over windows that take turns:
unscraped, 50 keep-alive scrapers at one scrape a second, 50 scrapers back to back, 1000 connections
trickling a byte a second (``--kinds`` picks among the three); each loaded window's tokens/s against the
mean of the unscraped windows on either side, the scrapers' latencies, the age of the collections the
answers stated (``Inferwatch-Collection-Age``, where the endpoint sends it), and the CPU of the
endpoint's thread in the serving process and of its helper process. ``--endpoints helper,thread`` (the
default) serves both from the one serving process, the helper process and a thread of the serving
process (``INFERWATCH_HTTP_PROCESS``), and loads them in turn; with two CPUs or more the serving
process is pinned to the first, the load generator and the helper to the second.

``--baseline DIR`` runs the same against an older tree laid out as a package, e.g. the commit before
issue 15::

    mkdir -p /tmp/base/inferwatch
    git archive 453abd4 cli common exporter instrumentation monitor bench | tar -x -C /tmp/base/inferwatch
    python tests/benchmarks/http_load.py exporter signals instrumentation --baseline /tmp/base --json out.json

Everything runs on 127.0.0.1; the machine's load average is recorded before and after each part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from tests.support import free_port, parse_samples  # noqa: E402
from tests.support import httpload as load  # noqa: E402
from tests.support.httpload import (  # noqa: E402
    Hostile,
    Latencies,
    Load,
    ProcessWatch,
    Target,
    exporter_listening,
    wait_listening,
)

FAKE_NVML = "tests.support.fake_nvml"
GPUS = 8


def environment(source: Path | None) -> dict[str, str]:
    """The environment of a process running the current tree, or the one in ``source``, before what was
    on ``PYTHONPATH`` (carried packages on a machine where nothing can be installed)."""
    path = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    if source is not None:
        path.insert(0, str(source))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


#: Set by ``--real-nvml``: the exporter reads the machine's GPUs instead of the stand-in's.
REAL_NVML = False


@contextmanager
def exporter(source: Path | None, *extra: str) -> Iterator[tuple[int, subprocess.Popen]]:
    port = free_port()
    env = environment(source)
    if not REAL_NVML:
        env |= {
            "INFERWATCH_EXPORTER_NVML_MODULE": FAKE_NVML,
            "FAKE_NVML_SCENARIO": json.dumps({"gpus": GPUS}),
        }
    cmd = [sys.executable, "-m", "inferwatch.exporter", f"--web.listen-address=127.0.0.1:{port}"]
    cmd += ["--collector.interval=1s", *extra]
    with exporter_listening(port, cmd, env) as popen:
        yield port, popen


class GpuWatch:
    """Scrapes through the loaded server twice a second: was any GPU served down, or a call counted hung?"""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.scrapes = 0
        self.failed = 0
        self.gpu_down = 0
        self.gpus = 0  # GPUs the last scrape served
        self.hung = 0.0

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            try:
                reader, writer = await asyncio.wait_for(load.connect(self.target), 10)
                writer.write(self.target.request())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:]
                )
                text = (await reader.readexactly(length)).decode()
                writer.close()
                self.scrapes += 1
                samples = list(parse_samples(text))
                self.gpu_down += any(s.name == "gpu_up" and s.value == 0 for s in samples)
                self.gpus = sum(s.name == "gpu_up" for s in samples)
                self.hung = sum(
                    s.value
                    for s in samples
                    if s.name == "inferwatch_exporter_nvml_errors_total" and s.labels.get("error") == "hung"
                )
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, StopIteration, ValueError):
                self.failed += 1
            await asyncio.sleep(0.5)

    def summary(self) -> dict[str, Any]:
        return {
            "probe_scrapes": self.scrapes,
            "probe_failures": self.failed,
            "gpus_served": self.gpus,
            "scrapes_with_gpu_down": self.gpu_down,
            "hung_count": self.hung,
        }


async def scrapers(target: Target, pid: int, count: int, seconds: float, period: float) -> dict[str, Any]:
    until = time.monotonic() + seconds
    out, watch, gpus = Latencies(), ProcessWatch(pid), GpuWatch(target)
    jobs = [load.keepalive_scraper(target, until, period, out) for _ in range(count)]
    if period:
        jobs = [_after(i * period / count, job) for i, job in enumerate(jobs)]
    await asyncio.gather(watch.run(until), gpus.run(until), *jobs)
    return {
        **out.summary(),
        "throughput_per_s": round(len(out.seconds) / seconds, 1),
        **watch.summary(),
        **gpus.summary(),
    }


async def _after(delay: float, job: Any) -> Any:
    await asyncio.sleep(delay)
    return await job


async def hostile(target: Target, pid: int, seconds: float, byte_every: float | None) -> dict[str, Any]:
    until = time.monotonic() + seconds
    slow, probe, watch = Hostile(), Latencies(), ProcessWatch(pid)
    await asyncio.gather(
        watch.run(until),
        *(load.slow_client(target, until, byte_every, slow) for _ in range(1000)),
        _after(2.0, load.fresh_scraper(target, until, 0.2, probe)),
    )
    return {"probe": probe.summary(), "slow": slow.summary(seconds), **watch.summary()}


async def sequential(target: Target, seconds: float) -> dict[str, Any]:
    out = Latencies()
    await load.keepalive_scraper(target, time.monotonic() + seconds, 0.0, out)
    return out.summary()


async def fresh(target: Target, seconds: float) -> dict[str, Any]:
    out = Latencies()
    await load.fresh_scraper(target, time.monotonic() + seconds, 0.1, out)
    return out.summary()


def measure_exporter(source: Path | None, scale: float, workdir: Path) -> dict[str, Any]:
    from tests.support.certs import self_signed_certificate

    result: dict[str, Any] = {"load_before": load.load_situation()}
    cert, key = self_signed_certificate(workdir)
    web = workdir / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    tls_client = __import__("ssl").create_default_context(cafile=str(cert))
    with exporter(source, f"--web.config.file={web}") as (port, _):
        target = Target("127.0.0.1", port, tls=tls_client)
        print("  TLS", flush=True)
        result["tls_keepalive"] = load.run(lambda: sequential(target, 5 * scale))
        result["tls_fresh"] = load.run(lambda: fresh(target, 5 * scale))
    with exporter(source) as (port, popen):
        target = Target("127.0.0.1", port)
        print("  sequential keep-alive", flush=True)
        result["sequential"] = load.run(lambda: sequential(target, 5 * scale))
        print("  200 scrapers at 1/s", flush=True)
        result["scrapers200_paced"] = load.run(lambda: scrapers(target, popen.pid, 200, 20 * scale, 1.0))
        print("  200 scrapers back to back", flush=True)
        result["scrapers200_flat_out"] = load.run(lambda: scrapers(target, popen.pid, 200, 20 * scale, 0.0))
    for label, every in (("trickle1000", 10.0), ("silent1000", None)):
        with exporter(source) as (port, popen):
            print(f"  {label}", flush=True)
            target = Target("127.0.0.1", port)
            result[label] = load.run(
                lambda target=target, pid=popen.pid, every=every: hostile(target, pid, 40 * scale, every)
            )
    result["load_after"] = load.load_situation()
    return result


def measure_signals(source: Path | None, tries: int) -> dict[str, Any]:
    outcomes = []
    for attempt in range(tries):
        signum = (signal.SIGTERM, signal.SIGINT)[attempt % 2]
        with exporter(source) as (port, popen), Load(Target("127.0.0.1", port), scrapers=200) as scraping:
            scraping.wait_for(200)
            time.sleep(0.5)
            started = time.monotonic()
            popen.send_signal(signum)
            try:
                status = popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                status = None
            elapsed = time.monotonic() - started
            try:
                socket.create_server(("127.0.0.1", port)).close()
                port_free = True
            except OSError:
                port_free = False
        ok = status == 0 and elapsed <= 1.0 and port_free
        outcomes.append(
            {
                "signal": signum.name,
                "status": status,
                "seconds": round(elapsed, 3),
                "port_free": port_free,
                "ok": ok,
            }
        )
        print(f"  {signum.name}: status {status}, {elapsed:.2f}s, port free {port_free}", flush=True)
    return {
        "tries": tries,
        "ok": sum(o["ok"] for o in outcomes),
        "max_seconds": max(o["seconds"] for o in outcomes),
        "outcomes": outcomes,
    }


# --- the instrumentation endpoint inside a serving process ------------------------------------------------


def tokens_per_second(requests: Path, start: float, end: float) -> float:
    """The serving loop's rate between ``start`` and ``end`` (``time.monotonic()``, one clock for every
    process), from the requests it logged as they finished. Not from the endpoint: under a flood it
    answers from a collection up to MAX_AGE old, which is the point of its budget."""
    finished = []
    for line in requests.read_text().splitlines():
        when, total = line.split()
        if start <= float(when) <= end:
            finished.append((float(when), int(total)))
    if len(finished) < 2:
        return float("nan")
    (first, before), (last, after) = finished[0], finished[-1]
    return (after - before) / (last - first)


async def window(port: int, pid: int, requests: Path, kind: str, seconds: float) -> dict[str, Any]:
    target = Target("127.0.0.1", port, headers=load.PROMETHEUS_HEADERS)
    until = time.monotonic() + seconds
    out, watch, slow = Latencies(), ProcessWatch(pid, thread="inferwatch-http"), Hostile()
    started = time.monotonic()
    jobs: list[Any] = [watch.run(until)]
    if kind == "scrapers50_paced":
        jobs += [_after(i / 50, load.keepalive_scraper(target, until, 1.0, out)) for i in range(50)]
    elif kind == "scrapers50_flat_out":
        jobs += [load.keepalive_scraper(target, until, 0.0, out) for _ in range(50)]
    elif kind == "trickle1000":
        jobs += [load.slow_client(target, until, 1.0, slow) for _ in range(1000)]
        jobs += [_after(1.0, load.fresh_scraper(target, until, 0.2, out))]
    await asyncio.gather(*jobs, asyncio.sleep(seconds))
    rate = tokens_per_second(requests, started, time.monotonic())
    return {"kind": kind, "tokens_per_s": rate, "scrapes": out.summary(), **watch.summary()}


def serve_model(requests: Path, endpoints: list[str]) -> None:
    """The serving loop of the ``instrumentation`` part (``http_load.py serve-model FILE ENDPOINT:PORT...``):
    one endpoint per ``ENDPOINT:PORT`` (where it does its HTTP work, :data:`ENDPOINTS`), and every
    finished request appends ``<time.monotonic()> <tokens generated so far>`` to ``FILE``."""
    import psutil
    import torch

    from inferwatch.instrumentation import instrument
    from inferwatch.instrumentation.demo.models import load_model
    from inferwatch.instrumentation.endpoint.server import start_http_server

    torch.set_num_threads(1)  # the serving loop on one core, the load generator on the other
    pinned = _pin(SERVING_CPU)
    model = load_model("small-llama", device="cpu")
    instrument(model, model_name="small-llama")
    for endpoint in endpoints:
        where, port = endpoint.split(":")
        os.environ["INFERWATCH_HTTP_PROCESS"] = ENDPOINTS[where]  # an older tree ignores it: a thread
        start_http_server(int(port))
    if pinned:  # an endpoint's helper process serves beside the load generator, not on the loop's core
        for helper in psutil.Process().children():
            helper.cpu_affinity([LOAD_CPU])
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    generated = 0
    with torch.inference_mode(), requests.open("a", buffering=1) as log:
        while True:
            model.generate(prompt, attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False)
            generated += 32
            log.write(f"{time.monotonic()} {generated}\n")


INSTRUMENTATION_KINDS = ("scrapers50_paced", "scrapers50_flat_out", "trickle1000")
#: With two CPUs or more, the serving process runs on the first and the load generator (with the
#: endpoint's helper process) on the second, so that the loop's tokens/s shows what the endpoint takes from
#: it (the GIL, in its process) rather than what the load generator's own clients take from the machine.
SERVING_CPU, LOAD_CPU = 0, 1


def _pin(cpu: int) -> bool:
    """Run this process on ``cpu`` alone, where the machine has two CPUs or more; whether it did."""
    if len(os.sched_getaffinity(0)) < 2:
        return False
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cpu]})
    return True


#: ``--endpoints``: where the endpoint does its HTTP work (``INFERWATCH_HTTP_PROCESS``): a helper process,
#: or a thread of the serving process (the only way before the helper, and the fallback).
ENDPOINTS = {"helper": "1", "thread": "0"}


def measure_instrumentation(
    source: Path | None,
    rounds: int,
    seconds: float,
    workdir: Path,
    kinds: tuple[str, ...],
    endpoints: tuple[str, ...],
) -> dict[str, Any]:
    """Every endpoint in one serving process, loaded in turn (each loaded window between two unscraped
    ones), so that they are compared over the same minutes of the same loop."""
    ports = {endpoint: free_port() for endpoint in endpoints}
    requests = workdir / f"requests-{min(ports.values())}.log"
    cmd = [sys.executable, __file__, "serve-model", str(requests)]
    cmd += [f"{endpoint}:{port}" for endpoint, port in ports.items()]
    windows: list[dict[str, Any]] = []
    cpus = os.sched_getaffinity(0)
    with tempfile.TemporaryFile() as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment(source))
        pinned = _pin(LOAD_CPU)
        try:
            for port in ports.values():
                wait_listening(port, popen, log, timeout=120)
            deadline = time.monotonic() + 120
            while not (requests.exists() and requests.read_text()) and time.monotonic() < deadline:
                time.sleep(0.5)  # the model is built and generating
            time.sleep(seconds)  # warm-up

            def measure(kind: str, endpoint: str) -> dict[str, Any]:
                measured = load.run(lambda: window(ports[endpoint], popen.pid, requests, kind, seconds))
                return {**measured, "endpoint": endpoint}

            for round_ in range(rounds):
                for kind in kinds:
                    for endpoint in endpoints:
                        # Each loaded window between two unscraped ones: their mean cancels drift.
                        windows.append(measure("unscraped", endpoint))
                        windows.append(measure(kind, endpoint))
                        rate = windows[-1]["tokens_per_s"]
                        print(f"  round {round_}: {kind}, {endpoint}: {rate:.1f} tok/s", flush=True)
            windows.append(measure("unscraped", endpoints[-1]))
        finally:
            popen.terminate()
            popen.wait(timeout=60)
            os.sched_setaffinity(0, cpus)
    summary: dict[str, Any] = {"pinned": pinned}
    for endpoint in endpoints:
        for kind in kinds:
            summary.setdefault(endpoint, {})[kind] = _loaded_summary(windows, kind, endpoint)
    summary["unscraped_tokens_per_s"] = [
        round(w["tokens_per_s"], 1) for w in windows if w["kind"] == "unscraped"
    ]
    return {"windows": windows, "summary": summary}


def _loaded_summary(windows: list[dict[str, Any]], kind: str, endpoint: str) -> dict[str, Any]:
    ratios, latencies, loaded = [], [], []
    for i, w in enumerate(windows):
        if w["kind"] == kind and w["endpoint"] == endpoint:
            around = (windows[i - 1]["tokens_per_s"] + windows[i + 1]["tokens_per_s"]) / 2
            ratios.append(w["tokens_per_s"] / around)
            latencies.append(w["scrapes"])
            loaded.append(w)
    ages = [w["scrapes"].get("collection_age_max_s") for w in loaded]
    return {
        "tokens_per_s_ratio_median": round(statistics.median(ratios), 4),
        "tokens_per_s_ratio_mean": round(statistics.mean(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "collection_age_max_s": max(ages) if None not in ages else None,
        "scrapes": latencies,
        "threads_max": max(w["threads_max"] for w in loaded),
        "endpoint_thread_cpu_percent": [w.get("thread_cpu_percent_of_core") for w in loaded],
        "helper_process_cpu_percent": [w.get("helper_cpu_percent_of_core") for w in loaded],
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("inferwatch", "uvicorn", "h11", "prometheus-client", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main() -> int:
    if sys.argv[1:2] == ["serve-model"]:
        serve_model(Path(sys.argv[2]), sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=("exporter", "signals", "instrumentation"))
    parser.add_argument("--baseline", type=Path, help="an older tree laid out as a package (see above)")
    parser.add_argument("--tries", type=int, default=40, help="signals sent (default 40)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of instrumentation windows (default 3)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per instrumentation window")
    parser.add_argument(
        "--kinds",
        default=",".join(INSTRUMENTATION_KINDS),
        help=f"instrumentation windows to load, comma-separated (default: {','.join(INSTRUMENTATION_KINDS)})",
    )
    parser.add_argument(
        "--endpoints",
        default="helper,thread",
        help="instrumentation: where the endpoint does its HTTP work, comma-separated, each loaded in "
        "turn in one serving process: helper (a process of its own), thread (in the serving process); a "
        "--baseline tree serves from a thread",
    )
    parser.add_argument("--quick", action="store_true", help="half the seconds of the exporter's scenarios")
    parser.add_argument("--real-nvml", action="store_true", help="the exporter reads this machine's GPUs")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(INSTRUMENTATION_KINDS):
        parser.error(f"--kinds: choose among {', '.join(INSTRUMENTATION_KINDS)}")
    endpoints = tuple(args.endpoints.split(","))
    if not set(endpoints) <= set(ENDPOINTS):
        parser.error(f"--endpoints: choose among {', '.join(ENDPOINTS)}")
    global REAL_NVML
    REAL_NVML = args.real_nvml
    load.raise_fd_limit(8192)
    sources: dict[str, Path | None] = {"current": None}
    if args.baseline is not None:
        sources["baseline"] = args.baseline.resolve()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "command": " ".join(sys.argv),
        "nvml": "real" if args.real_nvml else f"stand-in, {GPUS} GPUs",
        "versions": versions(),
        "results": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in sources.items():
            results = report["results"].setdefault(name, {})
            for part in args.parts:
                print(f"[{name}] {part}", flush=True)
                results[f"{part}_load_before"] = load.load_situation()
                if part == "exporter":
                    results[part] = measure_exporter(source, 0.5 if args.quick else 1.0, Path(tmp))
                elif part == "signals":
                    results[part] = measure_signals(source, args.tries)
                else:
                    results[part] = measure_instrumentation(
                        source,
                        args.rounds,
                        args.window,
                        Path(tmp),
                        kinds,
                        endpoints if source is None else ("thread",),
                    )
                results[f"{part}_load_after"] = load.load_situation()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"written to {args.json}")
    print(json.dumps({k: _brief(v) for k, v in report["results"].items()}, indent=1))
    return 0


def _brief(results: dict[str, Any]) -> dict[str, Any]:
    """The figures docs/benchmarks.md quotes, without the per-window detail."""
    out: dict[str, Any] = {}
    for part, value in results.items():
        if part == "instrumentation":
            out[part] = value["summary"]
        elif part == "signals":
            out[part] = {k: v for k, v in value.items() if k != "outcomes"}
        else:
            out[part] = value
    return out


if __name__ == "__main__":
    sys.exit(main())
