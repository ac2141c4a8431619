"""The HTTP layer of both endpoints, on real sockets: keep-alive done right, idle and slow-client limits,
a connection cap, request bodies consumed, TLS swapped while serving, the port released on stop, and the
CPU budget of the in-process endpoint."""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
import ssl
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from inferwatch.common.httpserver import (
    CpuBudget,
    HttpServer,
    Limits,
    Receive,
    Scope,
    Send,
    ServerThread,
    bind,
)
from tests.support.certs import self_signed_certificate
from tests.support.clock import ManualClock
from tests.support.services import wait_until

LOG = logging.getLogger("inferwatch.test.http")


def make_app(size: int = 64):
    body = b"x" * size

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@contextmanager
def serving(
    limits: Limits | None = None, size: int = 64, context: ssl.SSLContext | None = None
) -> Iterator[ServerThread]:
    server = HttpServer(make_app(size), bind("127.0.0.1", 0, 128), LOG, limits=limits, ssl_context=context)
    thread = ServerThread(server, "test-http")
    thread.start()
    try:
        yield thread
    finally:
        thread.close()


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (reading whatever it sent); fails after ``seconds``."""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.timing  # a latency bound: in the timing tier, not the unit tier's
def test_keepalive_http11_without_server_header_or_nagle_delay() -> None:
    with serving(size=64 * 1024) as thread:
        connection = http.client.HTTPConnection("127.0.0.1", thread.server.port, timeout=5)
        latencies = []
        for _ in range(30):
            started = time.perf_counter()
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert len(response.read()) == 64 * 1024
            latencies.append(time.perf_counter() - started)
            assert response.version == 11 and response.status == 200
            assert response.getheader("Server") is None
        connection.close()
    # Headers and body are two writes: without TCP_NODELAY each response waits ~40 ms for a delayed ACK.
    assert statistics.median(latencies) < 0.02, latencies


def test_a_get_with_a_body_is_read_not_taken_for_the_next_request() -> None:
    with serving() as thread, socket.create_connection(("127.0.0.1", thread.server.port), timeout=5) as sock:
        sock.sendall(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\nGET /evil HTTP/1.1"
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        received = b""
        while received.count(b"HTTP/1.1 ") < 2:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b"HTTP/1.1 200") == 2, received
    assert b"400" not in received


def test_silent_and_idle_connections_are_closed_after_the_idle_limit() -> None:
    with serving(Limits(idle_timeout=0.3)) as thread:
        with socket.create_connection(("127.0.0.1", thread.server.port)) as silent:
            assert 0.2 < closed_within(silent, 5) < 2
        with socket.create_connection(("127.0.0.1", thread.server.port)) as kept:
            kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert 0.2 < closed_within(kept, 5) < 2  # the answer, then nothing until the idle limit


@pytest.mark.timing
def test_a_trickling_request_is_cut_at_the_request_limit() -> None:
    with (
        serving(Limits(idle_timeout=30, request_timeout=0.5)) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port)) as slow,
    ):
        slow.settimeout(0.1)
        started = time.monotonic()
        head = b"GET /metrics HTTP/1.1\r\nHost: slowloris\r\nX-Padding: " + b"a" * 100
        closed = False
        for byte in head:  # a byte every 100 ms: never idle, never done
            try:
                slow.sendall(bytes([byte]))
                if slow.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed
        assert 0.4 < time.monotonic() - started < 3


def test_a_client_that_never_reads_is_cut_and_its_buffers_freed() -> None:
    size = 64 << 20  # more than the kernel buffers on both sides of a loopback connection hold
    with (
        serving(Limits(request_timeout=1.0), size=size) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port)) as lazy,
    ):
        lazy.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)
        assert thread.server.connections == 1  # answered, and stuck in the buffers
        wait_until(lambda: not thread.server.connections, 10, "the connection cut", interval=0.01)
        assert thread.server.connections == 0
        received = 0
        lazy.settimeout(5)
        try:
            while chunk := lazy.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < size


def test_clients_that_pipeline_and_never_read_are_cut_at_the_request_limit() -> None:
    # 50 answers of 16 KB each: more than the kernel holds for a connection that is not read, though
    # every answer is complete once handed over (what asyncio counts as pending stays small).
    with serving(Limits(idle_timeout=30, request_timeout=1.0), size=16 * 1024) as thread:
        lazy = [socket.create_connection(("127.0.0.1", thread.server.port)) for _ in range(20)]
        try:
            for sock in lazy:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
            wait_until(lambda: not thread.server.connections, 10, "the connections cut", interval=0.01)
            assert thread.server.connections == 0  # cut near the 1 s limit, not at the 30 s idle one
        finally:
            for sock in lazy:
                sock.close()


def test_at_the_cap_the_connection_that_waited_longest_gives_way_to_a_new_scrape() -> None:
    with serving(Limits(max_connections=3)) as thread:
        port = thread.server.port
        held = []
        for count in range(1, 4):  # silent clients, oldest first: each one in before the next connects
            held.append(socket.create_connection(("127.0.0.1", port)))
            wait_until(
                lambda n=count: thread.server.connections >= n, 5, f"{count} connections", interval=0.01
            )
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/")
            assert connection.getresponse().read()
            assert closed_within(held[0], 5) < 1  # the oldest silent one was cut for it
            for sock in held[1:]:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)  # still open
            # A client that got answers keeps its claim: the next newcomer cuts a silent one instead.
            with socket.create_connection(("127.0.0.1", port)):
                assert closed_within(held[1], 5) < 1
            connection.request("GET", "/")
            assert connection.getresponse().status == 200
            connection.close()
        finally:
            for sock in held:
                sock.close()


def test_an_answered_request_whose_body_is_still_coming_closes_the_connection() -> None:
    with (
        serving(Limits(idle_timeout=30, request_timeout=30)) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port), timeout=5) as sock,
    ):
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        assert closed_within(sock, 5) < 1  # answered, then closed: not held to drain a gigabyte


@pytest.mark.timing
def test_a_lone_crlf_does_not_end_the_idle_limit() -> None:
    with (
        serving(Limits(idle_timeout=0.5, request_timeout=30)) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port), timeout=5) as sock,
    ):
        started = time.monotonic()
        sock.sendall(b"\r\n")
        time.sleep(0.2)
        sock.sendall(b"\r\n")
        assert closed_within(sock, 5) + (time.monotonic() - started) < 3


def test_pipelined_requests_are_answered_in_order_however_many_arrive_at_once() -> None:
    count = 2000  # 36 KB of heads in one write: parsed a slice at a time, answered one by one
    with serving() as thread, socket.create_connection(("127.0.0.1", thread.server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        received = b""
        while received.count(b"HTTP/1.1 200") < count:
            chunk = sock.recv(1 << 20)
            assert chunk, received.count(b"HTTP/1.1 200")
            received += chunk
    assert received.count(b"HTTP/1.1 ") == count


def test_the_head_limit_counts_the_head_not_the_requests_before_it() -> None:
    with (
        serving(Limits(max_head_bytes=4096)) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port), timeout=10) as sock,
    ):
        complete = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 1000  # 28 KB of whole requests
        sock.sendall(complete + b"GET / HTTP/1.1\r\nHost: x\r\n")  # and a head under way
        received = b""
        while received.count(b"HTTP/1.1 200") < 1000:
            chunk = sock.recv(1 << 20)
            assert chunk, received[-200:]
            received += chunk
        assert b"400" not in received
        sock.sendall(b"\r\n")  # the head under way was short: answered like the others
        while received.count(b"HTTP/1.1 200") < 1001:
            chunk = sock.recv(1 << 20)
            assert chunk, received[-200:]
            received += chunk


def test_an_upgrade_request_is_answered_as_plain_http_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO),
        serving() as thread,
        socket.create_connection(("127.0.0.1", thread.server.port), timeout=5) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        assert closed_within(sock, 5) < 1
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text


def test_an_oversized_head_is_refused() -> None:
    with (
        serving(Limits(max_head_bytes=1024)) as thread,
        socket.create_connection(("127.0.0.1", thread.server.port), timeout=5) as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096)  # no end of head yet
        assert sock.recv(100).startswith(b"HTTP/1.1 400")


def test_stop_releases_the_port_and_closes_connections() -> None:
    with serving() as thread:
        port = thread.server.port
        kept = socket.create_connection(("127.0.0.1", port))
    try:
        assert closed_within(kept, 5) < 1
    finally:
        kept.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
    bind("127.0.0.1", port, 1).close()  # free for the next process at once


def test_tls_is_swapped_for_new_connections_without_a_gap(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    with serving() as thread:
        port = thread.server.port
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        plain.request("GET", "/")
        assert plain.getresponse().read()
        future = asyncio.run_coroutine_threadsafe(thread.server.replace_ssl_context(context), thread.loop)
        future.result(timeout=5)
        secure = http.client.HTTPSConnection("localhost", port, timeout=5, context=client)
        secure.request("GET", "/")
        assert secure.getresponse().status == 200
        # The connection opened before the swap goes on in plain HTTP.
        plain.request("GET", "/")
        assert plain.getresponse().status == 200
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            fresh.request("GET", "/")
            fresh.getresponse()


def test_the_cpu_budget_waits_out_what_was_used_beyond_the_share() -> None:
    async def scenario() -> tuple[bool, float]:
        clock = ManualClock()  # the wall clock; the CPU is this thread's own, spent for real
        budget = CpuBudget(share=0.5, burst=0.01, wall=clock)
        assert budget.available()
        spin_until = time.thread_time() + 0.06  # 60 ms of CPU: 50 ms beyond the burst
        while time.thread_time() < spin_until:
            pass
        exhausted = not budget.available()
        # ~0.05 / 0.5 = 100 ms to pay back, at half a core: the clock is moved a millisecond at a time.
        waited = await clock.advance_until_done(asyncio.ensure_future(budget.acquire()), step=0.001)
        return exhausted, waited

    exhausted, waited = asyncio.run(scenario())
    assert exhausted
    assert 0.05 < waited < 1.0


def test_an_urgent_caller_skips_the_queue_and_may_borrow_one_burst() -> None:
    used = [0.0]  # CPU seconds charged to the budget, by hand: no wall-clock race
    clock = ManualClock()  # and wall time that passes only when moved: never here

    async def scenario() -> list[str]:
        budget = CpuBudget(share=0.01, burst=0.1, clock=lambda: used[0], wall=clock)
        assert budget.available()  # the first look: what the clock says from here on is spent
        order: list[str] = []
        used[0] = 0.15  # a greedy client spent the burst and half a burst more

        async def greedy() -> None:
            await budget.acquire()
            order.append("greedy")

        waiting = asyncio.ensure_future(greedy())
        await asyncio.sleep(0)  # it looks, finds the bucket empty, and waits
        await budget.acquire(urgent=True)  # 0.05 in debt: within one burst
        order.append("urgent")
        used[0] = 0.25  # now 0.15 in debt: an urgent caller waits too
        assert budget._refilled() < -budget.burst
        waiting.cancel()
        return order

    assert asyncio.run(scenario()) == ["urgent"]


def test_cpu_spent_over_a_quiet_spell_within_the_share_is_not_charged_to_the_next_caller() -> None:
    """The CPU a budget's thread spends between two looks is paid from what the bucket gained over the
    same seconds: the endpoint's helper process counts its whole thread, whose idle work (pings, parent
    checks, heap trims: ~4 ms a second) made the first scrape after 130 s of quiet wait 3-4 s."""
    used = [0.0]
    clock = ManualClock()

    async def scenario() -> tuple[float, float, float]:
        budget = CpuBudget(share=0.1, burst=0.1, clock=lambda: used[0], wall=clock)
        assert budget.available()  # the first look
        for _ in range(130):  # no look for 130 s, 4 ms of CPU in each
            clock.advance(1.0)
            used[0] += 0.004
        full = budget._refilled()
        urgent = await clock.advance_until_done(asyncio.ensure_future(budget.acquire(urgent=True)), 0.01)
        queued = await clock.advance_until_done(asyncio.ensure_future(budget.acquire()), 0.01)
        return full, urgent, queued

    full, urgent, queued = asyncio.run(scenario())
    assert full == pytest.approx(0.1)
    assert urgent == 0.0 and queued == 0.0


def test_cpu_spent_beyond_what_a_quiet_spell_refilled_is_still_owed() -> None:
    used = [0.0]
    clock = ManualClock()
    budget = CpuBudget(share=0.1, burst=0.1, clock=lambda: used[0], wall=clock)
    assert budget.available()
    clock.advance(10.0)  # 1 s of CPU gained, 1.5 s spent: 0.4 s in debt, full as the spell began
    used[0] += 1.5
    assert budget._refilled() == pytest.approx(-0.4)
    clock.advance(5.0)  # 0.5 s gained: back to the burst, no more
    assert budget._refilled() == pytest.approx(0.1)


def test_a_taken_port_is_an_os_error_in_the_callers_thread() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as caught:
            bind("127.0.0.1", taken.getsockname()[1], 128)
    assert caught.value.errno is not None
