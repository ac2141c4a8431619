"""The program's hub against what any process of the same user can send it (issue 48): it runs no code
from its peers, outlives every bad connection and accept error, bounds every frame in size and time,
drops a peer that breaks the protocol (logged once, counted) and refuses peers beyond its cap.

Every peer here is a real socket on the hub's abstract address, written to by hand where the product's own
peer would never send such bytes; the hub, its threads and the endpoint's helper are the product's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from inferwatch.common.frames import PREFIX, frame, pack_families, read_frame
from inferwatch.common.lograte import RateLimit
from inferwatch.instrumentation.endpoint import program
from inferwatch.instrumentation.endpoint.program import (
    COLLECT_TIMEOUT,
    FRAME_TIMEOUT,
    MAX_PEERS,
    ProgramCollector,
    ProgramHub,
    _PeerAgent,
)
from inferwatch.instrumentation.endpoint.server import start_http_server
from tests.support import REPO_ROOT, http_get, sample_value
from tests.support.services import wait_until

from .test_program import _text

_PACKED = struct.Struct("!I")


@pytest.fixture(autouse=True)
def fresh_rate_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's lines counted from nothing (the hub's limit is per process, like its logger)."""
    monkeypatch.setattr(program.hub_log, "filters", [RateLimit()])


@pytest.fixture
def hub() -> Iterator[ProgramHub]:
    hub = ProgramHub()
    try:
        yield hub
    finally:
        hub.close()


def _registry(requests: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("llm_requests", "", ["model"], registry=registry).labels("m").inc(requests)
    return registry


def _scrape(collector: ProgramCollector) -> str:
    return _text(collector.collect())


def _value(collector: ProgramCollector, name: str, **labels: str) -> float:
    return sample_value(_scrape(collector), name, **labels) or 0


def _connect(hub: ProgramHub) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + hub.address)
    return sock


def _join(hub: ProgramHub, collector: ProgramCollector, role: str = "worker") -> socket.socket:
    """A hand-written peer, joined: what it sends from here on is the test's."""
    before = _value(collector, "inferwatch_run_processes", role=role)
    sock = _connect(hub)
    sock.sendall(frame({"op": "hello", "pid": os.getpid(), "role": role}))
    wait_until(
        lambda: _value(collector, "inferwatch_run_processes", role=role) == before + 1,
        timeout=10,
        what=f"the {role} peer on the hub",
    )
    return sock


def _answer_once(sock: socket.socket, body: bytes) -> threading.Thread:
    """Answer the hub's next collection request with ``body`` (in a thread: the scrape asks for it)."""

    def answer() -> None:
        head, _ = read_frame(sock)
        sock.sendall(frame({"op": "families", "id": head["id"]}, body))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def _closed_by_the_hub(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass  # a refusal's words, if any, before the close
    except ConnectionResetError:
        pass
    return True


class _Exploit:
    """What a pickle-reading hub runs: ``os.mkdir(path)`` as it reads the body."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


def test_a_collection_cannot_make_the_hub_run_code(hub: ProgramHub, tmp_path: Path) -> None:
    import pickle

    collector = ProgramCollector(hub, CollectorRegistry())
    peer = _join(hub, collector)
    marker = tmp_path / "ran"
    answered = _answer_once(peer, pickle.dumps(_Exploit(str(marker))))
    collector.collect()  # the hub before issue 48 ran the code here, then failed the collection
    answered.join(10)
    collector.collect()
    assert not marker.exists(), "the hub ran code that a peer sent"
    assert _value(collector, "inferwatch_run_process_exits_total", how="dropped") == 1


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "hello",
    [
        frame({"op": "hello"})[: PREFIX.size] + b"{}",  # a prefix that lies about the head's size
        PREFIX.pack(2, 0) + b"[]",  # a list, not an object
        PREFIX.pack(7, 0) + b'"hello"',
        PREFIX.pack(600, 0) + _deep(300),
        PREFIX.pack(5000, 0) + _deep(2500),  # deeper than the JSON parser goes (before, the hub's end)
        frame({"op": "hello", "role": ["engine"]}),
        frame({"op": "hello", "role": "engine", "pid": "1"}),
        frame({"op": "hello", "role": "main", "pid": 1}),  # the owner is the one main
        frame({"op": "families", "id": 1}),
        frame({"op": "hello", "role": "engine", "pid": 1}, b"a body"),
        b"GET / HTTP/1.1\r\n\r\n",
    ],
)
def test_the_hub_accepts_peers_after_any_bad_hello(hub: ProgramHub, hello: bytes) -> None:
    collector = ProgramCollector(hub, CollectorRegistry())
    rogue = _connect(hub)
    rogue.sendall(hello)
    assert _closed_by_the_hub(rogue)
    _PeerAgent(hub.address, "engine", registry=_registry(3))
    wait_until(
        lambda: _value(collector, "inferwatch_run_processes", role="engine") == 1,
        timeout=10,
        what="a peer that joined after the bad hello",
    )
    assert _value(collector, "llm_requests_total", model="m") == 3
    assert _value(collector, "inferwatch_run_refused_connections_total", reason="hello") == 1


# A hub in a process of its own whose descriptors run out while a peer waits in its backlog: accept()
# fails with EMFILE; once descriptors are free again, that peer and the next one join.
_EMFILE = """
import os, resource, sys, time
from inferwatch.instrumentation.endpoint.program import ProgramCollector, ProgramHub
from prometheus_client import CollectorRegistry

hub = ProgramHub()
collector = ProgramCollector(hub, CollectorRegistry())
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(hub.address, flush=True)
sys.stdin.readline()  # a peer is in the backlog
time.sleep(1.0)  # the hub's accept() fails meanwhile
for fd in held:
    os.close(fd)
print("freed", flush=True)
sys.stdin.readline()  # a second peer connected
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    live = {s.labels["role"]: s.value for f in collector.collect() if f.name == "inferwatch_run_processes"
            for s in f.samples}
    if live["worker"] == 2:
        break
    time.sleep(0.1)
print(int(live["worker"]), flush=True)
"""


def test_the_hub_accepts_peers_again_after_running_out_of_descriptors() -> None:
    hub = subprocess.Popen(
        [sys.executable, "-c", _EMFILE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert hub.stdin is not None and hub.stdout is not None
        address = hub.stdout.readline().strip()
        peers = []
        for step in ("in the backlog", "after"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect("\0" + address)
            sock.sendall(frame({"op": "hello", "pid": os.getpid(), "role": "worker"}))
            peers.append(sock)
            hub.stdin.write(f"{step}\n")
            hub.stdin.flush()
            if step != "after":
                assert hub.stdout.readline().strip() == "freed"
        assert hub.stdout.readline().strip() == "2", "the peers did not join once descriptors were free"
    finally:
        hub.kill()
        hub.wait(10)


def test_a_frame_beyond_its_bound_is_refused_at_its_prefix(hub: ProgramHub) -> None:
    """A hello announcing a 4 GiB body is cut before the hub reads any of it (it grew the serving
    process by 1.5 GB before issue 48); so is an answer beyond the collection bound."""
    collector = ProgramCollector(hub, CollectorRegistry())
    rogue = _connect(hub)
    head = json.dumps({"op": "hello", "role": "engine", "pid": 1}).encode()
    rogue.sendall(PREFIX.pack(len(head), (4 << 30) - 1) + head)
    rogue.settimeout(10)
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for _ in range(64):  # 64 MiB, far more than the socket's buffers
            rogue.sendall(b"\0" * (1 << 20))
    assert _value(collector, "inferwatch_run_refused_connections_total", reason="hello") == 1

    peer = _join(hub, collector)

    def announce() -> None:
        asked, _ = read_frame(peer)
        answer = json.dumps({"op": "families", "id": asked["id"]}).encode()
        peer.sendall(PREFIX.pack(len(answer), hub.max_collection + 1) + answer)

    threading.Thread(target=announce, daemon=True).start()
    wait_until(  # at the prefix, not once the body's time is out
        lambda: _value(collector, "inferwatch_run_process_exits_total", role="worker", how="dropped") == 1,
        timeout=FRAME_TIMEOUT - 1,
        what="the peer that announced a collection beyond the bound dropped",
    )
    assert _closed_by_the_hub(peer)


def _trickle(sock: socket.socket, data: bytes, interval: float) -> threading.Thread:
    def send() -> None:
        try:
            for index in range(len(data)):
                sock.send(data[index : index + 1])
                time.sleep(interval)
        except OSError:
            pass  # cut by the hub

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_trickled_hello_delays_no_other_peer_and_is_cut_at_its_deadline(hub: ProgramHub) -> None:
    """Its 40-odd bytes a third of a second apart take 13 s: another process joins while it is still
    coming (before issue 48 the hub read one hello at a time and the other waited it out), and it is
    cut at its deadline."""
    collector = ProgramCollector(hub, CollectorRegistry())
    trickler = _connect(hub)
    trickling = _trickle(trickler, frame({"op": "hello", "pid": 1, "role": "engine"}), interval=0.3)
    _PeerAgent(hub.address, "api", registry=_registry(1))
    wait_until(
        lambda: _value(collector, "inferwatch_run_processes", role="api") == 1,
        timeout=FRAME_TIMEOUT * 3,
        what="the api peer behind the trickled hello",
    )
    assert trickling.is_alive(), "the api peer joined only once the trickled hello was whole"
    assert _value(collector, "inferwatch_run_refused_connections_total", reason="hello") == 0
    assert _closed_by_the_hub(trickler, timeout=FRAME_TIMEOUT * 2)
    assert _value(collector, "inferwatch_run_refused_connections_total", reason="hello") == 1
    assert _value(collector, "inferwatch_run_processes", role="engine") == 0


def _while_an_answer_trickles(
    hub: ProgramHub, collector: ProgramCollector, scrape: Callable[[], str]
) -> tuple[list[float], str]:
    """Scrape (``scrape``) until a peer that answers a byte every half second is past its frame's time:
    each scrape's seconds, and the last answer."""
    peer = _join(hub, collector)

    def trickled_answer() -> None:
        asked, _ = read_frame(peer)
        _trickle(peer, frame({"op": "families", "id": asked["id"]}, pack_families([])), 0.5)

    threading.Thread(target=trickled_answer, daemon=True).start()
    latencies, body = [], ""
    deadline = time.monotonic() + FRAME_TIMEOUT + 2
    while time.monotonic() < deadline:
        started = time.monotonic()
        body = scrape()
        latencies.append(time.monotonic() - started)
        time.sleep(0.2)
    return latencies, body


def test_a_trickled_answer_gets_the_peer_dropped_and_the_helper_stays(hub: ProgramHub) -> None:
    """Before issue 48 every scrape waited on such a peer (40 s for its answer), and the endpoint's
    helper, whose pings went unanswered meanwhile, was killed as unresponsive."""
    collector = ProgramCollector(hub, _registry(2))
    with start_http_server(0, registry=collector) as server:

        def scrape() -> str:
            status, body = http_get(server.url, timeout=10)
            assert status == 200, body
            return body

        _, last = _while_an_answer_trickles(hub, collector, scrape)
    assert sample_value(last, "llm_requests_total", model="m") == 2
    assert sample_value(last, "inferwatch_run_process_exits_total", how="dropped") == 1
    assert sample_value(last, "inferwatch_endpoint_helper_restarts_total", reason="unresponsive") == 0
    assert sample_value(last, "inferwatch_endpoint_helper_restarts_total", reason="exited") == 0


@pytest.mark.timing  # a latency bound: in the timing tier, not the unit tier's
def test_a_trickled_answer_stalls_no_scrape(hub: ProgramHub) -> None:
    """A collection waits at most COLLECT_TIMEOUT for the trickling peer, once; then not at all."""
    collector = ProgramCollector(hub, _registry(2))
    latencies, _ = _while_an_answer_trickles(hub, collector, lambda: _scrape(collector))
    assert max(latencies) < 2 * COLLECT_TIMEOUT, latencies
    assert sorted(latencies)[-2] < COLLECT_TIMEOUT / 2, latencies  # only one waited


def _collection(families: object, tail: bytes = b"") -> bytes:
    return _raw(json.dumps(families).encode(), tail)


def _raw(encoded: bytes, tail: bytes = b"") -> bytes:
    return _PACKED.pack(len(encoded)) + encoded + tail


@pytest.mark.parametrize(
    "body",
    [
        b"\x80\x04garbage",
        b"",
        _collection({"families": []}),
        _collection([["llm_x", "", "gauge", ""]]),
        _collection([["llm_x", "", "gauge", "", [["llm_x", {}, "1"]]]]),  # a value that is a string
        _collection([["llm_x", "", "gauge", "", [["llm_x", {"model": 1}, 1.0]]]]),
        _collection([["llm_x", "", "gauge", "", [["llm_x", [["model", "m"]], 1.0]]]]),
        _collection([["llm_x", "", "gauge", "", [[1, {}, 1.0]]]]),
        _collection([["llm_x", "", "gauge", "", [["llm_x", {}, True]]]]),
        _collection([["llm_x", "", "gauge", "", [["llm_x", {}, 1.0, float("inf")]]]]),
        _collection([["llm_x", "", "gauge", "", [["llm_x", {}, 1.0, 1e300]]]]),  # beyond milliseconds
        _collection([["llm_x", "", "gauge", "", [["llm_x", {}, 10**400]]]]),  # beyond any float
        _collection([["llm_x", "", "gauge", "x\n# EOF", []]]),  # a unit that would end the exposition
        _collection([["llm_x", "", "nonsense", "", []]]),
        _collection([["", "", "gauge", "", []]]),
        _collection([["llm_x", "", "gauge", "", 3]], b"abc"),  # prerendered lines: the helper's only
        _collection([["llm_x", "", "gauge", "", []]], b"trailing"),
        _raw(b'[["llm_x", "", "gauge", "", [["llm_x", {"model": "\\ud800"}, 1.0]]]]'),  # a lone surrogate
        _raw(_deep(20000)),
    ],
)
def test_a_peer_that_answers_garbage_is_dropped_logged_once_and_counted(
    hub: ProgramHub, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    collector = ProgramCollector(hub, CollectorRegistry())
    _PeerAgent(hub.address, "engine", registry=_registry(5))
    wait_until(
        lambda: _value(collector, "inferwatch_run_processes", role="engine") == 1, 10, "the engine peer"
    )
    rogue = _join(hub, collector, role="api")
    answered = _answer_once(rogue, body)
    with caplog.at_level(logging.WARNING, logger="inferwatch.run"):
        first = _scrape(collector)  # before issue 48: an exception, a 500 for every scrape
        answered.join(10)
        second = _scrape(collector)
    for text in (first, second):
        assert sample_value(text, "llm_requests_total", model="m") == 5
    assert sample_value(second, "inferwatch_run_process_exits_total", role="api", how="dropped") == 1
    assert sample_value(second, "inferwatch_run_processes", role="api") == 0
    assert sample_value(second, "inferwatch_run_processes", role="engine") == 1
    lines = [r.getMessage() for r in caplog.records if "api process" in r.getMessage()]
    assert len(lines) == 1 and "broke the protocol" in lines[0], lines
    assert _closed_by_the_hub(rogue)


def test_peers_beyond_the_cap_are_refused_counted_and_logged_at_a_bounded_rate(
    hub: ProgramHub, caplog: pytest.LogCaptureFixture
) -> None:
    collector = ProgramCollector(hub, CollectorRegistry())
    with caplog.at_level(logging.WARNING, logger="inferwatch.run"):
        joined = []
        for _ in range(MAX_PEERS):
            sock = _connect(hub)
            sock.sendall(frame({"op": "hello", "pid": os.getpid(), "role": "worker"}))
            joined.append(sock)
        wait_until(
            lambda: _value(collector, "inferwatch_run_processes", role="worker") == MAX_PEERS,
            timeout=30,
            what="the peers up to the cap",
        )
        extra = [_connect(hub) for _ in range(20)]
        for sock in extra:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before its hello
                sock.sendall(frame({"op": "hello", "pid": os.getpid(), "role": "worker"}))
            assert _closed_by_the_hub(sock)
        # The program's own process beyond the cap is told why: as it sends its hello (which
        # join_program logs), or once it reads the hub's words (logged by its thread).
        try:
            _PeerAgent(hub.address, "engine", registry=_registry(1))
        except ConnectionRefusedError as exc:
            assert str(exc) == "it refused this process (full)"
        else:
            wait_until(
                lambda: any("refused this process" in r.getMessage() for r in caplog.records),
                timeout=10,
                what="the refused engine's line",
            )
        body = _scrape(collector)
        assert sample_value(body, "inferwatch_run_processes", role="worker") == MAX_PEERS
        assert sample_value(body, "inferwatch_run_refused_connections_total", reason="full") == 21
        for sock in joined:
            sock.close()
        wait_until(
            lambda: _value(collector, "inferwatch_run_processes", role="worker") == 0,
            timeout=30,
            what="the peers gone",
        )
    refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    gone = [r for r in caplog.records if "without a goodbye" in r.getMessage()]
    assert 1 <= len(refusals) <= 5, [r.getMessage() for r in refusals]
    assert 1 <= len(gone) <= 5, len(gone)  # 64 peers gone, 5 lines (the rest counted)
    for sock in extra:
        sock.close()
