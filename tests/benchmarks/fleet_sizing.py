"""What one Prometheus agent, VictoriaMetrics and vmalert cost at a given fleet size (docs/deploy.md,
"Past one Prometheus: sharded agents, VictoriaMetrics and vmalert", sizing).

One run, on the machine it runs on:

1. a real ``inferwatch-exporter`` over the NVML stand-in with ``--gpus`` GPUs serves one exposition
   (every default collector: a node's exporter series), captured once; a real ``inferwatch demo``
   (tiny-llama on CPU, a few seconds of requests) serves one instrumentation exposition, captured once,
   whose ``model`` label is then repeated for ``--models`` models (a node's serving series);
2. ``--nodes`` pairs of HTTP endpoints on loopback serve those captures, one port each (a node each:
   its own ``instance`` per job), from threads of this process;
3. one Prometheus agent (``--enable-feature=agent``, shard 0 of 1) scrapes them all every ``--interval``
   under the jobs the rules select (``inferwatch-exporter``, ``llm-serving``) and remote-writes to a
   single-node VictoriaMetrics; vmalert evaluates the shipped alerts/rules.yaml against it every
   ``--eval-interval``, writing the recording rules' results back (``--no-vmalert``: no rules, so that
   VictoriaMetrics' cost of ingestion shows apart from that of answering vmalert's queries);
4. after ``--warmup`` seconds, for ``--seconds``: the agent's active series, samples appended and sent
   per second and samples still pending (its own metrics), VictoriaMetrics' rows inserted per second and
   the series it holds, vmalert's rule errors, and each process's CPU (% of one core, from /proc) and
   resident memory (now and peak).

What it measures is the store's cost per node: what to give an agent shard, VictoriaMetrics and vmalert.
The time the rules take to evaluate per node is tests/benchmarks/fleet_rules.py's.

Usage, from the repository root (Debian's prometheus and victoria-metrics installed)::

    PYTHONPATH=. python tests/benchmarks/fleet_sizing.py --nodes 100 --gpus 8 --models 2 \
        --interval 15s --json fleet.json

The figures print as a table; ``--json PATH`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support import PACKAGE_ROOT, REPO_ROOT, free_port, http_get
from tests.support.services import (
    RunningProcess,
    start_demo,
    start_exporter,
    start_prometheus_agent,
    start_victoria_metrics,
    start_vmalert,
    start_webhook_receiver,
    wait_until,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
EXPORTER_JOB = "inferwatch-exporter"
SERVING_JOB = "llm-serving"
CAPTURED_MODEL = "m0"


def capture_node(gpus: int, workdir: Path) -> bytes:
    """One exposition of a real exporter over the NVML stand-in with ``gpus`` GPUs."""
    env = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": gpus}),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with start_exporter(env=env, workdir=workdir) as (_, address):
        # Past the first collection of every collector.
        time.sleep(3)
        status, body = http_get(f"http://{address}/metrics", timeout=10)
        assert status == 200, body[:200]
        return body.encode()


def capture_serving(models: int, workdir: Path) -> bytes:
    """One exposition of a real instrumented serving process, its model's series repeated under
    ``models`` values of the ``model`` label (m0, m1, ...), each copy beside its original so that every
    family's samples stay under its one HELP and TYPE."""
    with start_demo(
        model="tiny-llama",
        duration=600,
        max_new_tokens=8,
        extra_args=["--device=cpu", f"--model-name={CAPTURED_MODEL}"],
        workdir=workdir,
    ) as (_, address):
        label = f'model="{CAPTURED_MODEL}"'

        def served() -> str:
            return http_get(f"http://{address}/metrics", timeout=10)[1]

        # The model is built after the endpoint is up; then a few seconds of requests.
        wait_until(lambda: label in served(), 180, "the demo model's series")
        time.sleep(5)
        text = served()
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or label not in line:
            lines.append(line)
        else:
            lines.extend(line.replace(label, f'model="m{i}"') for i in range(models))
    return ("\n".join(lines) + "\n").encode()


def samples(body: bytes) -> int:
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))


@contextmanager
def serve_nodes(body: bytes, nodes: int) -> Iterator[list[str]]:
    """``nodes`` loopback endpoints, each serving ``body`` as its /metrics."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    servers = [ThreadingHTTPServer(("127.0.0.1", free_port()), Handler) for _ in range(nodes)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.MULTILINE))
    return {"rss_mb": int(found["VmRSS"]) / 1024, "peak_rss_mb": int(found["VmHWM"]) / 1024}


def metric(url: str, name: str) -> float:
    """The sum of the samples of ``name`` on a /metrics page."""
    _, body = http_get(f"{url}/metrics", timeout=10)
    pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$"
    return sum(float(v) for v in re.findall(pattern, body, re.MULTILINE))


def series_count(url: str) -> int:
    """The series VictoriaMetrics holds (``/api/v1/series/count``: from its index, no query)."""
    status, body = http_get(f"{url}/api/v1/series/count", timeout=60)
    assert status == 200, body[:200]
    return int(json.loads(body)["data"][0])


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    exposition = capture_node(args.gpus, work)
    serving = capture_serving(args.models, work) if args.models else b""
    with ExitStack() as stack:
        targets = {EXPORTER_JOB: stack.enter_context(serve_nodes(exposition, args.nodes))}
        if args.models:
            targets[SERVING_JOB] = stack.enter_context(serve_nodes(serving, args.nodes))
        webhook = stack.enter_context(start_webhook_receiver())
        vm = stack.enter_context(start_victoria_metrics(workdir=work / "vm"))
        agent = stack.enter_context(
            start_prometheus_agent(
                targets,
                vm.remote_write_url,
                shard=0,
                shards=1,
                interval=args.interval,
                workdir=work / "agent",
            )
        )
        vmalert = (
            stack.enter_context(
                start_vmalert(
                    [PACKAGE_ROOT / "alerts" / "rules.yaml"],
                    vm.url,
                    alertmanager=webhook.url.rstrip("/"),
                    interval=args.eval_interval,
                    workdir=work,
                )
            )
            if args.vmalert
            else None
        )
        agent.wait_for_targets_up(120)
        endpoints = sum(len(addresses) for addresses in targets.values())
        wait_until(lambda: len(vm.query("up")) == endpoints, 120, "every endpoint's up in VictoriaMetrics")
        time.sleep(args.warmup)
        processes: dict[str, RunningProcess] = {"agent": agent.process, "victoria-metrics": vm.process}
        if vmalert:
            processes["vmalert"] = vmalert.process
        start = {name: cpu_seconds(p.popen.pid) for name, p in processes.items()}
        appended0 = metric(agent.url, "prometheus_agent_samples_appended_total")
        sent0 = metric(agent.url, "prometheus_remote_storage_samples_total")
        inserted0 = metric(vm.url, "vm_rows_inserted_total")
        load0 = Path("/proc/loadavg").read_text().split()[0]
        t0 = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        # Each process's CPU and memory first: the queries below cost VictoriaMetrics work of their own.
        costs = {
            name: {
                "cpu_percent": round(100 * (cpu_seconds(p.popen.pid) - start[name]) / elapsed, 1),
                **{k: round(v, 1) for k, v in memory(p.popen.pid).items()},
            }
            for name, p in processes.items()
        }
        load1 = Path("/proc/loadavg").read_text().split()[0]
        appended = metric(agent.url, "prometheus_agent_samples_appended_total") - appended0
        sent = metric(agent.url, "prometheus_remote_storage_samples_total") - sent0
        inserted = metric(vm.url, "vm_rows_inserted_total") - inserted0
        rules = [rule for group in vmalert.rule_groups() for rule in group["rules"]] if vmalert else []
        result: dict[str, Any] = {
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "models_per_node": args.models,
            "exporter_series_per_node": samples(exposition),
            "serving_series_per_node": samples(serving),
            "scrape_interval": args.interval,
            "evaluation_interval": args.eval_interval if args.vmalert else None,
            "seconds": round(elapsed, 1),
            "agent_active_series": metric(agent.url, "prometheus_agent_active_series"),
            "agent_samples_per_second": round(appended / elapsed),
            "agent_samples_sent_per_second": round(sent / elapsed),
            "agent_samples_pending": metric(agent.url, "prometheus_remote_storage_samples_pending"),
            "vm_rows_inserted_per_second": round(inserted / elapsed),
            "vm_series": series_count(vm.url),
            "vmalert_rules": len(rules),
            "vmalert_rules_in_error": sum(1 for rule in rules if rule.get("lastError")),
            # Other work on the machine while measuring: the 1-minute load average, before and after.
            "load_average": [load0, load1],
        }
        result.update(costs)
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100, help="scrape targets, one node each")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (the NVML stand-in's)")
    parser.add_argument("--models", type=int, default=2, help="models served per node (0: none)")
    parser.add_argument("--interval", default="15s", help="the agent's scrape interval")
    parser.add_argument("--eval-interval", default="15s", help="vmalert's evaluation interval")
    parser.add_argument(
        "--no-vmalert",
        dest="vmalert",
        action="store_false",
        help="no rules: VictoriaMetrics' cost of ingestion alone, without vmalert's queries",
    )
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=90.0, help="seconds measured")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    # The processes' data and logs, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="inferwatch-fleet-") as work:
        result = measure(args, Path(work))
    for key, value in result.items():
        print(f"{key:30} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
