"""An HTTP load generator for the metrics endpoints: keep-alive scrapers, new-connection scrapers, and
hostile clients (silent, trickling), all on one asyncio loop so that a thousand connections cost the
client a thread, not a thousand.

Used by the integration tests (signals under load) and the benchmarks ``tests/benchmarks/http_servers.py``
(server libraries side by side) and ``tests/benchmarks/http_load.py`` (inferwatch's two endpoints under
load), which put the repository root on ``sys.path`` to import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
import os
import signal
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.reaper import forget, kill_with_this_process

# A scrape that takes longer has failed at Prometheus (its default scrape timeout is 10 s): counted as an
# error, so that a server whose backlog overflows cannot stall a scenario for minutes of SYN retries.
CONNECT_TIMEOUT = 10.0
ANSWER_TIMEOUT = 10.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


#: The instrumentation endpoint's header with the age of the collection an answer was encoded from
#: (inferwatch.instrumentation.endpoint.app.AGE_HEADER), lower-case as :func:`exchange` reads headers.
COLLECTION_AGE = "inferwatch-collection-age"


@dataclass
class Latencies:
    """Seconds per request, and the errors met, of one scenario; and the collection ages the answers
    stated, where the server states them (the instrumentation endpoint)."""

    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ages: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ms = [s * 1000 for s in self.seconds]
        out = {
            "requests": len(ms),
            "errors": len(self.errors),
            "error_kinds": sorted(set(self.errors))[:5],
            "p50_ms": round(percentile(ms, 50), 3),
            "p99_ms": round(percentile(ms, 99), 3),
            "max_ms": round(max(ms), 3) if ms else float("nan"),
            "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
        }
        if self.ages:
            out |= {
                "collection_age_p50_s": round(percentile(self.ages, 50), 3),
                "collection_age_p99_s": round(percentile(self.ages, 99), 3),
                "collection_age_max_s": round(max(self.ages), 3),
            }
        return out


#: What Prometheus sends with every scrape (its Accept header shortened to the two formats inferwatch
#: serves): it asks for gzip, which makes an answer a fifth of the size to write.
PROMETHEUS_HEADERS = (
    ("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"),
    ("Accept-Encoding", "gzip"),
    ("User-Agent", "Prometheus/2.53.0"),
    ("X-Prometheus-Scrape-Timeout-Seconds", "10"),
)


@dataclass(frozen=True)
class Answer:
    """One scrape's answer: when it was sent and fully read (``time.monotonic``), its status, headers and
    body (un-gzipped)."""

    sent: float
    received: float
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def scrape_every(
    port: int, period: float, until: float, headers: Mapping[str, str], keep_alive: bool = True
) -> Iterator[Answer | str]:
    """``GET /metrics`` on loopback ``port`` every ``period`` seconds until ``until`` (``time.monotonic``),
    on one kept-alive connection (a new one after an error) or a new one per scrape: each answer, or the
    error that took its place."""
    connection: http.client.HTTPConnection | None = None
    due = time.monotonic()
    try:
        while due < until:
            time.sleep(max(0.0, due - time.monotonic()))
            due += period
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_TIMEOUT)
                sent = time.monotonic()
                connection.request("GET", "/metrics", headers=dict(headers))
                response = connection.getresponse()
                body = response.read()
                received = time.monotonic()
            except (OSError, http.client.HTTPException) as exc:
                if connection is not None:
                    connection.close()
                connection = None
                yield repr(exc)
                continue
            if not keep_alive:
                connection.close()
                connection = None
            if response.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            yield Answer(sent, received, response.status, response.headers, body)
    finally:
        if connection is not None:
            connection.close()


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str = "/metrics"
    tls: ssl.SSLContext | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def request(self) -> bytes:
        lines = [f"GET {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def connect(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        target.host,
        target.port,
        ssl=target.tls,
        server_hostname="localhost" if target.tls else None,
        limit=1 << 20,
    )


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: Target,
    ages: list[float] | None = None,
) -> int:
    """One request on an open connection; the status, and the collection age the answer states appended
    to ``ages`` if it states one. Raises on a malformed or cut-short answer."""
    writer.write(target.request())
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.read()  # until the server closes
    if ages is not None and COLLECTION_AGE in headers:
        ages.append(float(headers[COLLECTION_AGE]))
    return status


async def keepalive_scraper(target: Target, until: float, period: float, out: Latencies) -> None:
    """One connection kept open, a request every ``period`` seconds (0: back to back) until ``until``;
    a failed connection is counted and opened again."""
    reader = writer = None
    due = time.monotonic()
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(connect(target), CONNECT_TIMEOUT)
            status = await asyncio.wait_for(exchange(reader, writer, target, out.ages), ANSWER_TIMEOUT)
            if status != 200:
                out.errors.append(f"HTTP {status}")
            else:
                out.seconds.append(time.perf_counter() - started)
        except (
            OSError,
            asyncio.IncompleteReadError,
            ValueError,
            asyncio.LimitOverrunError,
            asyncio.TimeoutError,
        ) as exc:
            out.errors.append(type(exc).__name__)
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.05)
        if period:
            due += period
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    if writer is not None:
        writer.close()


async def fresh_scraper(target: Target, until: float, period: float, out: Latencies) -> None:
    """A new connection per request (connect + request + close), every ``period`` seconds."""
    due = time.monotonic()
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(connect(target), CONNECT_TIMEOUT)
            try:
                status = await asyncio.wait_for(exchange(reader, writer, target, out.ages), ANSWER_TIMEOUT)
            finally:
                writer.close()
            if status != 200:
                out.errors.append(f"HTTP {status}")
            else:
                out.seconds.append(time.perf_counter() - started)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.TimeoutError) as exc:
            out.errors.append(type(exc).__name__)
        due += period
        await asyncio.sleep(max(0.0, due - time.monotonic()))


@dataclass
class Hostile:
    """Slow clients: how many connected, and when the server closed each (seconds after connecting)."""

    opened: int = 0
    failed_to_open: int = 0
    closed_after: list[float] = field(default_factory=list)

    def summary(self, window: float) -> dict[str, Any]:
        closed = sorted(self.closed_after)
        return {
            "opened": self.opened,
            "failed_to_open": self.failed_to_open,
            "closed_by_server": len(closed),
            "still_open_after_s": window,
            "closed_p50_s": round(percentile(closed, 50), 2) if closed else None,
            "closed_max_s": round(closed[-1], 2) if closed else None,
        }


async def slow_client(target: Target, until: float, byte_every: float | None, out: Hostile) -> None:
    """Connect, then send a request head one byte every ``byte_every`` seconds (None: send nothing),
    and note when the server closes the connection."""
    try:
        reader, writer = await asyncio.wait_for(connect(target), CONNECT_TIMEOUT)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        out.failed_to_open += 1
        return
    out.opened += 1
    opened = time.monotonic()
    head = target.request()
    try:
        sent = 0
        while time.monotonic() < until:
            wait = (byte_every if byte_every is not None else until - time.monotonic()) or 0.0
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout=max(0.01, wait))
            except asyncio.TimeoutError:
                data = None
            if data == b"":  # the server closed it
                out.closed_after.append(time.monotonic() - opened)
                return
            if data is None and byte_every is not None:
                writer.write(head[sent % (len(head) - 4) : sent % (len(head) - 4) + 1])
                sent += 1
    except (OSError, ssl.SSLError):
        out.closed_after.append(time.monotonic() - opened)
    finally:
        writer.close()


class ProcessWatch:
    """Threads, RSS and CPU time of a server process, sampled while a scenario runs; with ``thread``, also
    the CPU time of the process's threads of that OS name (``/proc/PID/task/*/comm``), and of its child
    processes of that name (the instrumentation endpoint's helper process)."""

    def __init__(self, pid: int, thread: str | None = None) -> None:
        self.process = psutil.Process(pid)
        self.threads_max = 0
        self.rss_max = 0
        self._tids = self._find(thread) if thread else set()
        self._helpers = [child for child in self.process.children() if thread and child.name() == thread]
        self._cpu_start = self._cpu()
        self._thread_start = self._thread_cpu()
        self._helpers_start = self._helpers_cpu()
        self._started = time.monotonic()

    def _helpers_cpu(self) -> float:
        total = 0.0
        for helper in self._helpers:
            with contextlib.suppress(psutil.Error):
                times = helper.cpu_times()
                total += times.user + times.system
        return total

    def _find(self, name: str) -> set[int]:
        """The process's threads of OS name ``name`` (several endpoints in one process: their sum)."""
        found = set()
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "comm").read_text().strip() == name:
                    found.add(int(task.name))
        return found

    def _thread_cpu(self) -> float:
        return sum(t.user_time + t.system_time for t in self.process.threads() if t.id in self._tids)

    def _cpu(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            with contextlib.suppress(psutil.Error):
                self.threads_max = max(self.threads_max, self.process.num_threads())
                self.rss_max = max(self.rss_max, self.process.memory_info().rss)
            await asyncio.sleep(0.2)

    def summary(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self._started
        out = {
            "threads_max": self.threads_max,
            "rss_max_mb": round(self.rss_max / 2**20, 1),
            "cpu_percent_of_core": round(100 * (self._cpu() - self._cpu_start) / elapsed, 1),
        }
        if self._tids:
            out["thread_cpu_percent_of_core"] = round(
                100 * (self._thread_cpu() - self._thread_start) / elapsed, 2
            )
        if self._helpers:
            out["helper_cpu_percent_of_core"] = round(
                100 * (self._helpers_cpu() - self._helpers_start) / elapsed, 2
            )
        return out


async def gather_until(until: float, *jobs: Awaitable[Any]) -> None:
    await asyncio.gather(*jobs)
    await asyncio.sleep(max(0.0, until - time.monotonic()))


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


def wait_listening(port: int, process: subprocess.Popen, log: Any, timeout: float = 60) -> None:
    """Wait until ``process`` accepts connections on ``port``; exit with its output (``log``, a file) if
    it ends or does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                output = log.read().decode(errors="replace")
                raise SystemExit(f"{process.args} did not start:\n{output}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def exporter_listening(port: int, cmd: Sequence[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen]:
    """``cmd``, an exporter listening on ``port``, in a process session of its own: yielded once it
    listens and two collections have read every GPU; killed with its children at the end."""
    with tempfile.TemporaryFile() as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        kill_with_this_process(popen.pid)
        try:
            wait_listening(port, popen, log)
            time.sleep(2.5)  # two collections at the benchmarks' 1 s interval
            yield popen
        finally:
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            forget(popen.pid)


def raise_fd_limit(wanted: int) -> None:
    """A thousand hostile connections need a thousand descriptors on each side."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def load_situation() -> dict[str, Any]:
    """What else the machine was doing: load averages at the time of the figures."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


class Load:
    """Scrapers on a thread of their own for as long as the ``with`` block runs (tests that must do
    something else meanwhile, such as signalling the server)."""

    def __init__(self, target: Target, scrapers: int, period: float = 0.0) -> None:
        self.target = target
        self.scrapers = scrapers
        self.period = period
        self.latencies = Latencies()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        async def scrapers() -> None:
            until = time.monotonic() + 3600
            jobs = [
                asyncio.ensure_future(keepalive_scraper(self.target, until, self.period, self.latencies))
                for _ in range(self.scrapers)
            ]
            while not self._stop.is_set():
                await asyncio.sleep(0.05)
            # Python 3.11's wait_for loses a cancellation that arrives as its inner await completes (fixed
            # in 3.12): a scraper could go on for the hour; cancel again until every one has stopped.
            while jobs:
                for job in jobs:
                    job.cancel()
                _, still_running = await asyncio.wait(jobs, timeout=0.5)
                jobs = list(still_running)

        asyncio.run(scrapers())

    def wait_for(self, requests: int, timeout: float = 30.0) -> None:
        """Block until ``requests`` scrapes have been answered (the load is really flowing)."""
        deadline = time.monotonic() + timeout
        while len(self.latencies.seconds) < requests:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.latencies.seconds)} of {requests} scrapes in {timeout}s")
            time.sleep(0.02)
