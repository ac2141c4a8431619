"""HTTP server libraries side by side, under the loads of issue 15, to choose the metrics endpoints' server.

Each candidate serves the same fixed body (62 KB, the size of an 8-GPU exporter scrape) from a process
of its own, configured as it would be in production with the same limits (a 5 s idle / slow-client
limit where the library has one, 4 worker threads where it uses a pool, a listen backlog of 1024), and
meets the same clients, one scenario after another:

* ``sequential``: one keep-alive connection, requests back to back (Nagle + delayed ACK shows as ~40 ms);
* ``tls``: the same over TLS, and a new TLS connection per request (where the library has TLS);
* ``keepalive200``: 200 keep-alive scrapers, one request a second each (200/s), for 20 s;
* ``closed200``: 200 keep-alive connections back to back (as fast as the server answers), for 10 s;
* ``trickle1000``: 1000 connections sending a request head one byte every 10 s, and ``trickle1000_fast``
  one byte a second (a slowloris), beside a probe scraping 5 times a second on new connections;
* ``silent1000``: 1000 connections that send nothing, beside the same probe.

uvicorn runs with each of its two HTTP/1.1 parsers, h11 (pure Python) and httptools (llhttp, in C).

The candidates live outside the project's dependencies; install them into any virtual environment and
point ``--python`` at it::

    python3 -m venv /tmp/cand
    /tmp/cand/bin/pip install cheroot waitress uvicorn h11 httptools prometheus-client psutil bcrypt
    python tests/benchmarks/http_servers.py --python /tmp/cand/bin/python --json http-servers.json   # ~10 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support import free_port
from tests.support import httpload as loadgen
from tests.support.httpload import Hostile, Latencies, ProcessWatch, Target

CANDIDATES = ("stdlib", "cheroot", "waitress", "uvicorn-h11", "uvicorn-httptools")
IDLE_LIMIT_S = 5
THREADS = 4
BACKLOG = 1024
BODY_BYTES = 62 * 1024


def body() -> bytes:
    line = b'gpu_clock_hz{clock="sm",gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"} 1.755e+09\n'
    return (line * (BODY_BYTES // len(line) + 1))[:BODY_BYTES]


# --- the servers (run in a subprocess: ``http_servers.py serve NAME PORT [CERT KEY]``) -------------------


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    payload = body()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(payload)))])
    return [payload]


async def asgi_app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    payload = body()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def serve(name: str, port: int, cert: str | None, key: str | None) -> None:
    if name == "stdlib":  # today's instrumentation endpoint: prometheus_client's wsgiref server
        from wsgiref.simple_server import make_server

        from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

        make_server("127.0.0.1", port, wsgi_app, ThreadingWSGIServer, _SilentHandler).serve_forever()
    elif name == "cheroot":
        from cheroot import wsgi
        from cheroot.ssl.builtin import BuiltinSSLAdapter

        server = wsgi.Server(
            ("127.0.0.1", port),
            wsgi_app,
            numthreads=THREADS,
            max=THREADS,
            timeout=IDLE_LIMIT_S,
            request_queue_size=BACKLOG,
        )
        if cert:
            server.ssl_adapter = BuiltinSSLAdapter(cert, key)
        server.start()
    elif name == "waitress":
        import waitress

        waitress.serve(
            wsgi_app,
            host="127.0.0.1",
            port=port,
            threads=THREADS,
            connection_limit=2000,
            channel_timeout=IDLE_LIMIT_S,
            cleanup_interval=1,
            backlog=BACKLOG,
            _quiet=True,
        )
    elif name.startswith("uvicorn-"):
        import uvicorn

        uvicorn.run(
            asgi_app,
            host="127.0.0.1",
            port=port,
            http=name.removeprefix("uvicorn-"),
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=IDLE_LIMIT_S,
            backlog=BACKLOG,
            ssl_certfile=cert,
            ssl_keyfile=key,
        )
    else:
        raise SystemExit(f"unknown server {name!r}")


# --- the scenarios ----------------------------------------------------------------------------------------


def tls_client_context(cert: Path) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(cert))


async def scenario_latency(target: Target, seconds: float) -> dict[str, Any]:
    out = Latencies()
    await loadgen.keepalive_scraper(target, time.monotonic() + seconds, 0.0, out)
    return out.summary()


async def scenario_fresh(target: Target, seconds: float, rate: float) -> dict[str, Any]:
    out = Latencies()
    await loadgen.fresh_scraper(target, time.monotonic() + seconds, 1 / rate, out)
    return out.summary()


async def scenario_scrapers(target: Target, pid: int, count: int, seconds: float, period: float) -> dict:
    until = time.monotonic() + seconds
    out, watch = Latencies(), ProcessWatch(pid)
    jobs = [loadgen.keepalive_scraper(target, until, period, out) for _ in range(count)]
    if period:  # spread the scrapers over the period rather than firing all at once
        jobs = [_after(i * period / count, job) for i, job in enumerate(jobs)]
    await asyncio.gather(watch.run(until), *jobs)
    process = watch.summary()
    cpu_seconds = process["cpu_percent_of_core"] / 100 * seconds
    return {
        **out.summary(),
        "throughput_per_s": round(len(out.seconds) / seconds, 1),
        "server_cpu_us_per_request": round(1e6 * cpu_seconds / max(len(out.seconds), 1), 1),
        **process,
    }


async def _after(delay: float, job: Any) -> Any:
    await asyncio.sleep(delay)
    return await job


async def scenario_hostile(
    target: Target, pid: int, count: int, seconds: float, byte_every: float | None
) -> dict[str, Any]:
    until = time.monotonic() + seconds
    hostile, probe, watch = Hostile(), Latencies(), ProcessWatch(pid)
    slow = [loadgen.slow_client(target, until, byte_every, hostile) for _ in range(count)]
    # The probe starts once the slow clients are in.
    await asyncio.gather(
        watch.run(until),
        *slow,
        _after(2.0, loadgen.fresh_scraper(target, until, 0.2, probe)),
    )
    return {"probe": probe.summary(), "slow": hostile.summary(seconds), **watch.summary()}


def measure(name: str, python: str, cert: Path, key: Path, quick: bool) -> dict[str, Any]:
    scale = 0.5 if quick else 1.0
    result: dict[str, Any] = {"tls": name == "cheroot" or name.startswith("uvicorn-")}
    if result["tls"]:
        with server_process(python, name, cert, key) as (port, _):
            tls = Target("127.0.0.1", port, tls=tls_client_context(cert))
            print(f"[{name}] TLS", flush=True)
            result["tls_keepalive"] = loadgen.run(lambda: scenario_latency(tls, 5 * scale))
            result["tls_fresh"] = loadgen.run(lambda: scenario_fresh(tls, 5 * scale, 10))
    with server_process(python, name) as (port, pid):
        plain = Target("127.0.0.1", port)
        print(f"[{name}] sequential keep-alive", flush=True)
        result["sequential"] = loadgen.run(lambda: scenario_latency(plain, 5 * scale))
        print(f"[{name}] 200 keep-alive scrapers at 1/s", flush=True)
        result["keepalive200"] = loadgen.run(lambda: scenario_scrapers(plain, pid, 200, 20 * scale, 1.0))
        print(f"[{name}] 200 keep-alive scrapers back to back", flush=True)
        result["closed200"] = loadgen.run(lambda: scenario_scrapers(plain, pid, 200, 10 * scale, 0))
    for label, every in (("trickle1000", 10.0), ("trickle1000_fast", 1.0), ("silent1000", None)):
        # A fresh server for each: what one scenario leaves behind must not weigh on the next.
        with server_process(python, name) as (port, pid):
            print(f"[{name}] {label}", flush=True)
            plain = Target("127.0.0.1", port)
            result[label] = loadgen.run(
                lambda plain=plain, pid=pid, every=every: scenario_hostile(
                    plain, pid, 1000, 20 * scale, every
                )
            )
    return result


@contextmanager
def server_process(
    python: str, name: str, cert: Path | None = None, key: Path | None = None
) -> Iterator[tuple[int, int]]:
    """A candidate serving on a free port, as (port, pid); TLS when ``cert`` is given."""
    port = free_port()
    cmd = [python, __file__, "serve", name, str(port)]
    if cert is not None:
        cmd += [str(cert), str(key)]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            loadgen.wait_listening(port, server, log, timeout=30)
            yield port, server.pid
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, platform\n"
        "out = {'python': platform.python_version()}\n"
        "for d in ('cheroot', 'waitress', 'uvicorn', 'h11', 'httptools', 'prometheus-client'):\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: out[d] = 'not installed'\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    rows = [
        ("sequential keep-alive p50 ms", lambda r: r["sequential"]["p50_ms"]),
        ("TLS keep-alive p50 ms", lambda r: r["tls_keepalive"]["p50_ms"] if r["tls"] else "no TLS"),
        ("TLS new connection p50 ms", lambda r: r["tls_fresh"]["p50_ms"] if r["tls"] else "no TLS"),
        ("200 scrapers at 1/s: p50 / p99 ms", lambda r: _pair(r["keepalive200"], "p50_ms", "p99_ms")),
        ("200 scrapers at 1/s: errors", lambda r: r["keepalive200"]["errors"]),
        (
            "200 scrapers at 1/s: threads / RSS MB",
            lambda r: _pair(r["keepalive200"], "threads_max", "rss_max_mb"),
        ),
        (
            "200 back to back: scrapes/s, p99 ms",
            lambda r: _pair(r["closed200"], "throughput_per_s", "p99_ms"),
        ),
        ("200 back to back: errors", lambda r: r["closed200"]["errors"]),
        ("server CPU per request, µs (back to back)", lambda r: r["closed200"]["server_cpu_us_per_request"]),
    ]
    for label in ("trickle1000", "trickle1000_fast", "silent1000"):
        rows += [
            (f"{label}: probe p50 / p99 ms", lambda r, k=label: _pair(r[k]["probe"], "p50_ms", "p99_ms")),
            (f"{label}: probe errors", lambda r, k=label: r[k]["probe"]["errors"]),
            (f"{label}: threads / RSS MB", lambda r, k=label: _pair(r[k], "threads_max", "rss_max_mb")),
            (
                f"{label}: closed by server / opened",
                lambda r, k=label: f"{r[k]['slow']['closed_by_server']}/{r[k]['slow']['opened']}",
            ),
            (f"{label}: closed after (max s)", lambda r, k=label: r[k]["slow"]["closed_max_s"]),
        ]
    names = list(results)
    print("| | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for label, get in rows:
        cells = []
        for name in names:
            try:
                cells.append(str(get(results[name])))
            except (KeyError, TypeError):
                cells.append("-")
        print(f"| {label} | " + " | ".join(cells) + " |")


def _pair(row: dict[str, Any], a: str, b: str) -> str:
    return f"{row[a]} / {row[b]}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        name, port, *tls = sys.argv[2:]
        serve(name, int(port), *(tls or (None, None)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter that has the candidates")
    parser.add_argument("--servers", default=",".join(CANDIDATES), help="comma-separated candidates")
    parser.add_argument("--quick", action="store_true", help="half the seconds of every scenario")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    loadgen.raise_fd_limit(8192)
    from tests.support.certs import self_signed_certificate

    with tempfile.TemporaryDirectory() as tmp:
        cert, key = self_signed_certificate(Path(tmp))
        started_load = loadgen.load_situation()
        results = {
            name: measure(name, args.python, cert, key, args.quick) for name in args.servers.split(",")
        }
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "command": " ".join(sys.argv),
        "versions": versions(args.python),
        "load_before": started_load,
        "load_after": loadgen.load_situation(),
        "settings": {
            "idle_limit_s": IDLE_LIMIT_S,
            "threads": THREADS,
            "backlog": BACKLOG,
            "body_bytes": BODY_BYTES,
        },
        "results": results,
    }
    print_table(results)
    print(f"load average before {started_load['loadavg']}, after {report['load_after']['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
