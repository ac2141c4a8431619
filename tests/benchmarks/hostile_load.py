"""The exporter's endpoint under the hostile loads of issue 29, beside a normal scraper, one scenario per
fresh ``inferwatch-exporter`` (NVML stand-in, 8 GPUs, 1 s polls):

* ``slow_body``: 1030 connections each sending ``GET /metrics`` with ``Content-Length: 1000000000`` and
  no body;
* ``half_open_tls``: over TLS, 1000 TCP connections that never send a ClientHello;
* ``pipelined50``: 50 connections each pipelining 10 485 GETs, reading the answers;
* ``burst5mb``: 20 connections each writing 256 KiB of pipelined GETs at once, reading the answers;
* ``unread200``: 200 connections sending 50 pipelined GETs each and reading nothing;
* ``reload``: TLS and basic auth, 50 keep-alive scrapers at 5/s for 10 s without a reload, then 10 s
  with 30 SIGHUPs (the first half is the unloaded figure the second is compared with).

Beside each, a probe scrapes on a new connection 5 times a second (the figure that must stay under
50 ms); the exporter's RSS is read before, at the peak, and 11 s after the attack's connections are gone,
and its open connections (``/proc``) once a second, so that the time the server took to close the
hostile ones shows. Run from the repository root::

    python tests/benchmarks/hostile_load.py --json /tmp/hostile.json [--only slow_body,reload]

``--endpoint instrumentation`` runs the same loads (but ``reload``: that endpoint reads its web config
once) against ``start_http_server`` in a process that serves an instrumented model's worth of histograms
and does nothing else: the RSS of that serving process and of the endpoint's helper process, which
holds the connections, are read apart.

Everything runs on 127.0.0.1; the load average is recorded before and after each scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from tests.support import free_port  # noqa: E402
from tests.support import httpload as load  # noqa: E402
from tests.support.certs import bcrypt_hash, self_signed_certificate  # noqa: E402
from tests.support.httpload import Latencies, Target, exporter_listening  # noqa: E402

FAKE_NVML = "tests.support.fake_nvml"
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
#: Seconds after an attack's connections are gone that its RSS is read: two of the exporter's heap trims.
AFTER = 11.0


#: ``--endpoint``: the exporter, or the instrumentation endpoint of a serving process.
ENDPOINTS = ("exporter", "instrumentation")
ENDPOINT = "exporter"
# A serving process's metrics in miniature: a registry the size of an instrumented model's (60
# histograms), served by start_http_server on the port given, and nothing else running.
_SERVING = """
import sys, time
from prometheus_client import Histogram
from inferwatch.instrumentation.endpoint.server import start_http_server
for i in range(60):
    Histogram(f"llm_bench_histogram_{i}", "A histogram.").observe(0.1)
start_http_server(int(sys.argv[1]))
time.sleep(3600)
"""


@contextmanager
def endpoint(web: Path | None = None) -> Iterator[tuple[int, subprocess.Popen]]:
    """The endpoint under attack (:data:`ENDPOINT`), with the web config ``web``; its port and process."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if ENDPOINT == "exporter":
        env |= {"INFERWATCH_EXPORTER_NVML_MODULE": FAKE_NVML, "FAKE_NVML_SCENARIO": json.dumps({"gpus": 8})}
        cmd = [sys.executable, "-m", "inferwatch.exporter", f"--web.listen-address=127.0.0.1:{port}"]
        cmd += [f"--web.config.file={web}"] if web is not None else []
    else:
        env |= {"INFERWATCH_WEB_CONFIG_FILE": str(web)} if web is not None else {}
        cmd = [sys.executable, "-c", _SERVING, str(port)]
    with exporter_listening(port, cmd, env) as popen:
        yield port, popen


class ServerWatch:
    """RSS and open TCP connections of the server, once a second; for the instrumentation endpoint, the
    serving process's RSS and its helper process's (which holds the connections) apart."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.helpers = [child for child in self.process.children() if child.name() == "inferwatch-http"]
        self.rss_start = self.rss()
        self.rss_peak = self.rss_start
        self.helper_rss_start = self.helper_rss()
        self.helper_rss_peak = self.helper_rss_start
        self.connections: list[tuple[float, int]] = []  # (seconds since start, open connections)
        self._started = time.monotonic()

    def rss(self) -> float:
        return self.process.memory_info().rss / 2**20

    def helper_rss(self) -> float:
        return sum(helper.memory_info().rss for helper in self.helpers) / 2**20

    def open_connections(self) -> int:
        return sum(
            c.status == psutil.CONN_ESTABLISHED
            for process in (self.process, *self.helpers)
            for c in process.net_connections("tcp")
        )

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            with suppress(psutil.Error):
                self.rss_peak = max(self.rss_peak, self.rss())
                self.helper_rss_peak = max(self.helper_rss_peak, self.helper_rss())
                self.connections.append((round(time.monotonic() - self._started, 1), self.open_connections()))
            await asyncio.sleep(1.0)

    def summary(self) -> dict[str, Any]:
        out = {
            "rss_start_mb": round(self.rss_start, 1),
            "rss_peak_mb": round(self.rss_peak, 1),
            "open_connections_max": max((n for _, n in self.connections), default=0),
            "open_connections_by_second": self.connections[::5],
        }
        if self.helpers:
            out |= {
                "helper_rss_start_mb": round(self.helper_rss_start, 1),
                "helper_rss_peak_mb": round(self.helper_rss_peak, 1),
            }
        return out


async def hold(target: Target, payload: bytes, until: float, read: bool, closed: list[float]) -> None:
    """Connect, write ``payload``, then read (and drop) answers, or nothing, until ``until`` or the server
    closes; the seconds to that close are appended to ``closed``."""
    try:
        reader, writer = await asyncio.wait_for(load.connect(target), load.CONNECT_TIMEOUT)
    except (OSError, asyncio.TimeoutError):
        return
    opened = time.monotonic()
    try:
        if payload:
            writer.write(payload)
        if not read:
            writer.transport.pause_reading()
            await asyncio.sleep(until - time.monotonic())
            return
        while time.monotonic() < until:
            chunk = await asyncio.wait_for(reader.read(1 << 20), max(0.01, until - time.monotonic()))
            if not chunk:
                closed.append(time.monotonic() - opened)
                return
    except (OSError, asyncio.TimeoutError):
        if time.monotonic() < until:
            closed.append(time.monotonic() - opened)
    finally:
        writer.transport.abort()


def probe_main(port: int, seconds: float, cafile: str) -> None:
    """The probe, in a process of its own: the attack's client loop must not delay it."""
    tls = ssl.create_default_context(cafile=cafile) if cafile else None
    out = Latencies()
    time.sleep(2.0)  # from when the attack's connections are open: its steady state, not its arrival
    load.run(
        lambda: load.fresh_scraper(Target("127.0.0.1", port, tls=tls), time.monotonic() + seconds, 0.2, out)
    )
    print(json.dumps(out.summary()))


async def attack(
    pid: int,
    probe_target: Target,
    seconds: float,
    jobs: Callable[[float], list[Awaitable[Any]]],
    cafile: str = "",
) -> dict[str, Any]:
    """The attack's jobs beside the probe for ``seconds``; then the RSS :data:`AFTER` s after."""
    watch = ServerWatch(pid)
    until = time.monotonic() + seconds
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "probe",
        str(probe_target.port),
        str(seconds - 2),
        cafile,
        stdout=asyncio.subprocess.PIPE,
    )
    await asyncio.gather(watch.run(until), probe.wait(), *jobs(until))
    probed = json.loads((await probe.stdout.read()).decode())  # type: ignore[union-attr]
    await asyncio.sleep(AFTER)
    after = {"rss_after_mb": round(watch.rss(), 1), "open_connections_after": watch.open_connections()}
    if watch.helpers:
        after["helper_rss_after_mb"] = round(watch.helper_rss(), 1)
    return {"probe": probed, **watch.summary(), **after}


def closed_summary(closed: list[float], count: int) -> dict[str, Any]:
    ordered = sorted(closed)
    return {
        "connections": count,
        "closed_by_server": len(ordered),
        "closed_p50_s": round(load.percentile(ordered, 50), 2) if ordered else None,
        "closed_max_s": round(ordered[-1], 2) if ordered else None,
    }


def held(
    pid: int,
    probe: Target,
    attacker: Target,
    seconds: float,
    payload: bytes,
    read: bool,
    count: int,
    key: str,
    cafile: str = "",
) -> dict[str, Any]:
    """``count`` connections to ``attacker``, each sending ``payload`` (and reading what comes back when
    ``read``), held beside the probe on ``probe``: the attack's figures, with how the server closed them
    under ``key``."""
    closed: list[float] = []
    result = load.run(
        lambda: attack(
            pid,
            probe,
            seconds,
            lambda u: [hold(attacker, payload, u, read, closed) for _ in range(count)],
            cafile,
        )
    )
    return {**result, key: closed_summary(closed, count)}


def slow_body(seconds: float) -> dict[str, Any]:
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
    with endpoint() as (port, popen):
        target = Target("127.0.0.1", port)
        return held(popen.pid, target, target, seconds, head, True, 1030, "slow")


def half_open_tls(seconds: float, workdir: Path) -> dict[str, Any]:
    cert, key = self_signed_certificate(workdir)
    web = workdir / "tls.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    with endpoint(web) as (port, popen):
        plain = Target("127.0.0.1", port)  # no ClientHello is ever sent
        probe = Target("127.0.0.1", port, tls=ssl.create_default_context(cafile=str(cert)))
        return held(popen.pid, probe, plain, seconds, b"", True, 1000, "half_open", str(cert))


def pipelined(seconds: float, connections: int, payload: bytes, read: bool) -> dict[str, Any]:
    with endpoint() as (port, popen):
        target = Target("127.0.0.1", port)
        return held(popen.pid, target, target, seconds, payload, read, connections, "attackers")


def reload(seconds: float, workdir: Path) -> dict[str, Any]:
    cert, key = self_signed_certificate(workdir)
    web = workdir / "auth.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret')}'\n"
    )
    token = base64.b64encode(b"prometheus:s3cret").decode()
    context = ssl.create_default_context(cafile=str(cert))
    out: dict[str, Any] = {}
    with endpoint(web) as (port, popen):
        target = Target("127.0.0.1", port, tls=context, headers=(("Authorization", f"Basic {token}"),))
        for phase, reloads in (("unloaded", 0), ("with_30_sighups", 30)):
            with load.Load(target, scrapers=50, period=0.2) as running:
                running.wait_for(50)
                started = time.monotonic()
                for _ in range(reloads):
                    popen.send_signal(signal.SIGHUP)
                    time.sleep(seconds / reloads)
                time.sleep(max(0.0, seconds - (time.monotonic() - started)))
            out[phase] = running.latencies.summary()
    return out


SCENARIOS = ("slow_body", "half_open_tls", "pipelined50", "burst5mb", "unread200", "reload")


def main() -> int:
    if sys.argv[1:2] == ["probe"]:
        probe_main(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds each attack lasts (default 20)")
    parser.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="exporter",
        help="the exporter (default), or start_http_server in a serving process (no SIGHUP: no reload)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    global ENDPOINT
    ENDPOINT = args.endpoint
    if ENDPOINT == "instrumentation" and "reload" in args.only.split(","):
        parser.error("--only: the instrumentation endpoint reads its web config once: no reload scenario")
    load.raise_fd_limit(8192)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "endpoint": ENDPOINT,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            print(name, flush=True)
            before = load.load_situation()
            if name == "slow_body":
                result = slow_body(args.seconds)
            elif name == "half_open_tls":
                result = half_open_tls(args.seconds, Path(tmp))
            elif name == "pipelined50":
                result = pipelined(args.seconds, 50, GET * 10_485, read=True)
            elif name == "burst5mb":
                result = pipelined(args.seconds, 20, GET * (256 * 1024 // len(GET)), read=True)
            elif name == "unread200":
                result = pipelined(args.seconds, 200, GET * 50, read=False)
            elif name == "reload":
                result = reload(args.seconds / 2, Path(tmp))
            else:
                parser.error(f"--only: choose among {', '.join(SCENARIOS)}")
            report[name] = {"load_before": before, **result, "load_after": load.load_situation()}
            print(json.dumps(report[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
