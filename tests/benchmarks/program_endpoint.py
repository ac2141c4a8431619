"""The program's one endpoint over ``transformers serve`` with an engine process (transformers 5.25 on).

``inferwatch run -- transformers serve MODEL`` on a small local model, sequential, continuous batching
and ``--api-server-count 2`` (``--modes``): two streaming ``openai`` clients send requests without pause
while the endpoint is scraped in windows that take turns, unscraped, one scrape a second (Prometheus'
pace), ten a second. Per window:

* the clients' tokens/s (their ``usage``), against the mean of the unscraped windows on either side;
* the scrapes' latency (p50, p99, max) and the age of the collection each answer states
  (``Inferwatch-Collection-Age``);
* the CPU seconds per second of each process of the program, by role: the process that serves the
  endpoint (``main``, the API in the sequential case), the engine, the API servers, the endpoint's
  helper (``inferwatch-http``);
* at the end, what inferwatch counted against what the clients were told (requests, tokens).

Run it on a quiet machine (``--seconds`` per window, ``--rounds`` of the three windows)::

    .venv/bin/python tests/benchmarks/program_endpoint.py --seconds 10 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from tests.support import sample_value  # noqa: E402
from tests.support.servemodel import write_serve_model  # noqa: E402
from tests.support.transformers_serve import Server, serve, stream_chat  # noqa: E402

MODES = {
    "sequential": (),
    "continuous-batching": ("--continuous-batching", "--cb-num-blocks=512", "--cb-max-batch-tokens=512"),
    "api-servers-2": ("--api-server-count=2",),
}
CLIENTS = 2
MAX_TOKENS = 32


def roles(root: int, api_port: int) -> dict[str, list[psutil.Process]]:
    """The program's processes by role: of the processes transformers serve spawned, those that listen
    on the API's port are API servers, the other is the engine."""
    top = psutil.Process(root)
    helper, api, engine = [], [], []
    for child in top.children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            listening = {c.laddr.port for c in child.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
        if "inferwatch.instrumentation.endpoint.helper_process" in line:
            helper.append(child)
        elif "spawn_main" in line and "resource_tracker" not in line:
            (api if api_port in listening else engine).append(child)
    return {"main": [top], "engine": engine, "api": api, "helper": helper}


def cpu(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    total = {}
    for role, members in processes.items():
        seconds = 0.0
        for process in members:
            try:
                times = process.cpu_times()
                seconds += times.user + times.system
            except psutil.Error:
                pass
        total[role] = seconds
    return total


class Clients:
    """Streaming clients without pause; tokens counted from each response's ``usage``."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._lock = threading.Lock()
        self.tokens = 0
        self.prompt_tokens = 0
        self.requests = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        client = self._server.client()
        while not self._stop.is_set():
            done = stream_chat(client, self._server.model, "tell me a story", max_tokens=MAX_TOKENS)
            with self._lock:
                self.tokens += done.completion_tokens
                self.prompt_tokens += done.prompt_tokens
                self.requests += 1

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def window(server: Server, clients: Clients, seconds: float, hz: float, processes: dict) -> dict[str, Any]:
    tokens_before, cpu_before, started = clients.tokens, cpu(processes), time.monotonic()
    latencies, ages = [], []
    session = requests.Session()
    while time.monotonic() - started < seconds:
        if hz:
            sent = time.monotonic()
            answer = session.get(server.metrics_url, timeout=10)
            latencies.append(time.monotonic() - sent)
            ages.append(float(answer.headers.get("Inferwatch-Collection-Age", "nan")))
            time.sleep(max(0.0, 1 / hz - (time.monotonic() - sent)))
        else:
            time.sleep(0.1)
    elapsed = time.monotonic() - started
    cpu_after = cpu(processes)
    out: dict[str, Any] = {
        "scrapes_per_second": hz,
        "tokens_per_second": (clients.tokens - tokens_before) / elapsed,
        "cpu_per_second": {role: (cpu_after[role] - cpu_before[role]) / elapsed for role in cpu_after},
    }
    if latencies:
        ordered = sorted(latencies)
        out["scrape_ms"] = {
            "p50": 1000 * statistics.median(ordered),
            "p99": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max": 1000 * ordered[-1],
        }
        out["collection_age_s"] = {"p50": statistics.median(ages), "max": max(ages)}
    return out


def run_mode(name: str, options: tuple[str, ...], seconds: float, rounds: int, work: Path) -> dict:
    model_dir = write_serve_model(work / name / "model")
    with serve(
        work / name, model_dir, force_model=True, model_timeout=600, name=name, options=options
    ) as server:
        processes = roles(server.process.popen.pid, server.api_port)
        before = server.metrics()
        clients = Clients(server)
        clients.start()
        time.sleep(3)  # warm: the first requests compile nothing, but allocate
        windows = []
        for _ in range(rounds):
            for hz in (0.0, 1.0, 10.0):
                windows.append(window(server, clients, seconds, hz, processes))
        windows.append(window(server, clients, seconds, 0.0, processes))
        clients.stop()
        time.sleep(1.5)
        after = server.metrics()
    counted = {
        metric: (sample_value(after, metric) or 0) - (sample_value(before, metric) or 0)
        for metric in ("llm_generation_tokens_total", "llm_prompt_tokens_total")
    }
    requests_ok = (sample_value(after, "llm_requests_total", status="ok") or 0) - (
        sample_value(before, "llm_requests_total", status="ok") or 0
    )
    unscraped = [w for w in windows if not w["scrapes_per_second"]]
    for index, entry in enumerate(windows):
        if entry["scrapes_per_second"]:
            near = [
                w["tokens_per_second"] for w in (windows[index - 1], windows[index + 1]) if w in unscraped
            ]
            reference = (
                statistics.mean(near) if near else statistics.mean(w["tokens_per_second"] for w in unscraped)
            )
            entry["tokens_per_second_vs_unscraped"] = entry["tokens_per_second"] / reference
    return {
        "mode": name,
        "processes": {role: len(members) for role, members in processes.items()},
        "windows": windows,
        "clients": {
            "requests": clients.requests,
            "tokens": clients.tokens,
            "prompt_tokens": clients.prompt_tokens,
        },
        "inferwatch": {"requests_ok": requests_ok, **counted},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import transformers

    results: dict[str, Any] = {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "cpus": psutil.cpu_count(),
        "load_before": psutil.getloadavg(),
        "modes": [],
    }
    with tempfile.TemporaryDirectory() as work:
        for name in args.modes.split(","):
            results["modes"].append(run_mode(name, MODES[name], args.seconds, args.rounds, Path(work)))
            print(json.dumps(results["modes"][-1], indent=1), flush=True)
    results["load_after"] = psutil.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
