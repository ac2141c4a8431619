"""One metrics endpoint for every process of a program that ``inferwatch run`` launched.

A serving program may run its model in one process and its HTTP API in others (``transformers serve``
from 5.25: an engine process, and the API in the parent or in ``--api-server-count`` processes).
``inferwatch run`` serves the metrics of all of them on its one port, merged as one program's:

* the process that serves the endpoint (the program's first, the **owner**) opens a :class:`ProgramHub`
  on a local socket whose address its descendants inherit (:data:`HUB_ENV`); the endpoint collects a
  :class:`ProgramCollector`, which is the owner's registry merged with its peers' collections;
* a descendant **joins** (:func:`join_program`) once it has something to report: the first generating
  model it builds (role ``engine``), or the HTTP edge it serves (role ``api``). One daemon thread there
  answers the hub's collection requests with the process's registry (prometheus_client's default
  collectors of the process itself left out), so a peer costs its program one collection per endpoint
  collection, within the endpoint's budgets;
* the merge (:func:`merge_families`) adds what processes count (counters, histograms, the catalogue's
  ``livesum`` gauges) and takes the largest or smallest value where the catalogue says so
  (``livemax``: info series, heartbeats); so a series that only one process has is passed on as it is;
* a peer that exits (it says goodbye) or dies (its socket closes without a word, as after ``SIGKILL``)
  leaves no gauge behind, while its counters and histograms stay in the sums at their last collected
  values: counters never go back. Its end is logged once and counted in
  ``inferwatch_run_process_exits_total{role, how}``; ``inferwatch_run_processes{role}`` has the live ones.

What a peer counted after its last collection and before a ``SIGKILL`` is lost (a scrape interval at
most); a clean exit sends its last collection with its goodbye. Processes forked from one that already
had metrics do not join: their registry is a copy of the parent's, and would count it twice
(``--multiprocess-dir`` is the way for pre-forking servers such as gunicorn). This module does not
import torch.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from inferwatch.common.frames import frame, pack_families, read_frame, unpack_families
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

logger = logging.getLogger("inferwatch.run")

#: The hub's address (a Linux abstract socket name), set by the owner for its descendants.
HUB_ENV = "INFERWATCH_PROGRAM_HUB"
#: Seconds the hub waits for its peers' collections in one endpoint collection; a peer that has not
#: answered by then is served from its last collection (and counted as late).
COLLECT_TIMEOUT = 0.5
#: Seconds a peer that has begun to send a frame gets to finish it, before it counts as dead.
_FRAME_TIMEOUT = 5.0
#: Seconds between the hub's looks at whether a peer's socket has closed (a process that died).
WATCH_INTERVAL = 1.0
#: The families a process's registry has about the process itself (prometheus_client's default
#: collectors): the owner's stand for the endpoint; a peer's are left out of the merge.
_OWN_PROCESS_PREFIXES = ("process_", "python_")
# struct ucred: the connecting process's pid, uid and gid, as the kernel vouches for them.
_CREDENTIALS = struct.Struct("3i")
#: The roles a process can have (a bounded label): the owner, a process with models, one serving the API.
ROLES = ("main", "engine", "api", "worker")


def _mode_of_gauges() -> dict[str, str]:
    """Family name -> how the values of several processes combine: the catalogue's multiprocess mode
    without its ``live`` prefix (``sum``, ``max``, ``min``, ``mostrecent``)."""
    from inferwatch.instrumentation.metrics.catalogue import CATALOGUE

    return {
        spec.name: (spec.multiprocess_mode or "sum").removeprefix("live")
        for spec in CATALOGUE
        if spec.type == "gauge"
    }


_GAUGE_MODES = _mode_of_gauges()
_COUNTING_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def _combine(kind: str, family: str, sample: str, old: float, new: float) -> float:
    if sample.endswith("_created"):
        return min(old, new)
    if kind in _COUNTING_TYPES or kind == "unknown":
        return old + new
    if kind in ("info", "stateset") or family.endswith("_info"):
        return max(old, new)
    mode = _GAUGE_MODES.get(family, "sum")
    if mode in ("max", "mostrecent"):
        return max(old, new)
    if mode == "min":
        return min(old, new)
    return old + new


def merge_families(sources: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The families of several processes as one program's: samples with the same name and labels are
    combined (:func:`_combine`); families keep the order in which they were first seen."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for families in sources:
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                held = samples.get(key)
                if held is None:
                    samples[key] = sample
                else:
                    value = _combine(target.type, family.name, sample.name, held.value, sample.value)
                    samples[key] = held._replace(value=value)
    for name, family in merged.items():
        family.samples = list(values[name].values())
    return list(merged.values())


def _counting_only(families: Iterable[Metric]) -> list[Metric]:
    """What stays of a gone process: its counters and histograms, not its gauges."""
    return [family for family in families if family.type in _COUNTING_TYPES]


def _own_families(registry: Collector) -> list[Metric]:
    return [f for f in registry.collect() if not f.name.startswith(_OWN_PROCESS_PREFIXES)]


# --- the owner's side ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Peer:
    sock: socket.socket
    pid: int
    role: str
    last: list[Metric] = field(default_factory=list)  # its last collection


class ProgramHub:
    """The owner's end: accepts the program's processes on an abstract local socket, asks them for their
    collections, and keeps what the gone ones counted. Thread-safe; one lock guards the peers, their
    sockets and what the gone ones left."""

    def __init__(self) -> None:
        global _hub_pid
        _hub_pid = os.getpid()
        self.address = f"inferwatch-{os.getpid()}-{secrets.token_hex(8)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)
        self._listener.listen(64)
        self._lock = threading.Lock()
        self._peers: list[_Peer] = []
        self._gone: list[Metric] = []  # the counters of every process that has gone, summed
        self._exits: dict[tuple[str, str], int] = {}  # (role, how) -> processes gone that way
        self._late: dict[str, int] = {}  # role -> collections a peer did not answer in time
        self._asked = 0
        self._closed = False
        threading.Thread(target=self._accept, name="inferwatch-hub", daemon=True).start()
        threading.Thread(target=self._watch, name="inferwatch-hub-watch", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                pid, uid, _ = _CREDENTIALS.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
                )
                if uid != os.getuid():  # an abstract socket is open to every user of the machine
                    raise PermissionError(f"a process of user {uid} tried to join")
                sock.settimeout(COLLECT_TIMEOUT)
                head, _ = read_frame(sock)
                peer = _Peer(sock, pid, head["role"] if head.get("role") in ROLES else "worker")
            except (OSError, EOFError, ValueError, KeyError, TypeError):
                sock.close()
                continue
            with self._lock:
                self._peers.append(peer)

    def _watch(self) -> None:
        """Notice peers that went away between collections, so that their end is logged when it happens
        (and take late answers, which are fresher than what the peer had sent before)."""
        while not self._closed:
            time.sleep(WATCH_INTERVAL)
            with self._lock:
                for peer in list(self._peers):
                    readable, _, _ = select.select([peer.sock], [], [], 0)
                    if readable:
                        self._read(peer)  # a late answer, a goodbye, or a closed socket

    def _retire(self, peer: _Peer, how: str) -> None:
        """(lock held) The peer is gone: its counters join the gone ones', its gauges are dropped."""
        self._peers.remove(peer)
        peer.sock.close()
        self._gone = merge_families([self._gone, _counting_only(peer.last)])
        key = (peer.role, how)
        self._exits[key] = self._exits.get(key, 0) + 1
        logger.warning(
            "inferwatch run: the %s process %d of the program %s; its counters are kept, its gauges dropped",
            peer.role,
            peer.pid,
            "exited" if how == "exited" else "is gone without a goodbye (killed or crashed)",
        )

    def gather(self) -> list[list[Metric]]:
        """Every peer's collection (its last one where it did not answer in time), and the gone ones'."""
        with self._lock:
            self._asked += 1
            asked = self._asked
            peers = list(self._peers)
            for peer in peers:
                try:
                    peer.sock.sendall(frame({"op": "collect", "id": asked}))
                except OSError:
                    self._retire(peer, "died")
            deadline = time.monotonic() + COLLECT_TIMEOUT
            for peer in peers:
                if peer in self._peers:
                    self._receive(peer, asked, deadline)
            return [peer.last for peer in self._peers] + [self._gone]

    def _receive(self, peer: _Peer, asked: int, deadline: float) -> None:
        """(lock held) Read the peer's answer to collection ``asked``, skipping late answers to earlier
        ones. A peer that has not begun to answer by ``deadline`` keeps its last collection; one that has
        begun gets :data:`_FRAME_TIMEOUT` to finish its frame."""
        while True:
            readable, _, _ = select.select([peer.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                self._late[peer.role] = self._late.get(peer.role, 0) + 1
                return
            if self._read(peer) in (None, asked):
                return

    def _read(self, peer: _Peer) -> int | None:
        """(lock held) Read one frame of a peer that has begun to send: a collection (its id is returned),
        or its goodbye or closed socket (the peer is retired, None is returned)."""
        try:
            peer.sock.settimeout(_FRAME_TIMEOUT)
            head, body = read_frame(peer.sock)
        except (OSError, EOFError, ValueError):
            self._retire(peer, "died")
            return None
        if body:
            peer.last = unpack_families(body)
        if head.get("op") == "bye":
            self._retire(peer, "exited")
            return None
        return head.get("id")

    def self_families(self) -> list[Metric]:
        """The hub's own series: live processes by role, gone ones by role and how, late collections."""
        with self._lock:
            live = {role: 0 for role in ROLES}
            live["main"] = 1
            for peer in self._peers:
                live[peer.role] += 1
            exits, late = dict(self._exits), dict(self._late)
        processes = Metric(
            "inferwatch_run_processes",
            "Processes of the launched program on this endpoint, by role.",
            "gauge",
        )
        for role, count in live.items():
            processes.add_sample("inferwatch_run_processes", {"role": role}, count)
        gone = Metric(
            "inferwatch_run_process_exits",
            "Processes of the launched program that left the endpoint: exited (said goodbye) or died.",
            "counter",
        )
        for (role, how), count in sorted(exits.items()):
            gone.add_sample("inferwatch_run_process_exits_total", {"role": role, "how": how}, count)
        slow = Metric(
            "inferwatch_run_late_collections",
            f"Collections a process did not answer within {COLLECT_TIMEOUT} s (its last one was served).",
            "counter",
        )
        for role, count in sorted(late.items()):
            slow.add_sample("inferwatch_run_late_collections_total", {"role": role}, count)
        return [processes, gone, slow]

    def engines(self) -> list[int]:
        """The process ids of the live processes that have models."""
        with self._lock:
            return [peer.pid for peer in self._peers if peer.role == "engine"]

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for peer in self._peers:
                peer.sock.close()
            self._peers.clear()


class ProgramCollector:
    """What the endpoint of ``inferwatch run`` collects: the owner's registry merged with its peers'."""

    def __init__(self, hub: ProgramHub, registry: Collector = REGISTRY) -> None:
        self._hub = hub
        self._registry = registry

    def collect(self) -> list[Metric]:
        own = list(self._registry.collect())
        return merge_families([own, *self._hub.gather(), self._hub.self_families()])

    def describe(self) -> list[Metric]:
        return []

    def models_elsewhere(self) -> str | None:
        """Where the program's models are when this process has none and other processes of it do (the
        engine of transformers serve 5.25), else None."""
        from inferwatch.instrumentation.metrics.catalogue import existing_metrics

        metrics = existing_metrics(None)
        if metrics is not None and any(count > 0 for count in metrics.live_models.values()):
            return None
        engines = self._hub.engines()
        if not engines:
            return None
        return "the program's models run in its engine process " + ", ".join(str(pid) for pid in engines)


# --- a peer's side ------------------------------------------------------------------------------------

_join_lock = threading.Lock()
_joined: _PeerAgent | _Unreachable | None = None
_forked_child = False
_hub_pid: int | None = None  # the process whose hub is this one (it reports to itself)


def _note_fork() -> None:
    global _forked_child, _joined
    _forked_child = True
    _joined = None  # the parent's agent thread did not survive the fork


os.register_at_fork(after_in_child=_note_fork)


def join_program(role: str) -> None:
    """Report this process's registry on the endpoint of the program it belongs to, from now on (once per
    process; ``role`` is one of :data:`ROLES`). Nothing happens outside ``inferwatch run``, in the owner,
    in forked children, or when the hub cannot be reached (logged once). Never raises."""
    global _joined
    address = os.environ.get(HUB_ENV)
    if not address or _forked_child or _hub_pid == os.getpid():
        return
    with _join_lock:
        if _joined is not None:
            return
        try:
            _joined = _PeerAgent(address, role)
        except OSError as exc:
            logger.warning(
                "inferwatch run: this process (%s, pid %d) cannot reach the program's metrics endpoint: %s; "
                "its metrics are not served",
                role,
                os.getpid(),
                exc,
            )
            _joined = _Unreachable()


class _Unreachable:
    """A process that tried to join and could not: it does not try again."""


class _PeerAgent:
    """A joined process's thread: answers the hub's collection requests, says goodbye at exit."""

    def __init__(self, address: str, role: str, registry: Collector = REGISTRY) -> None:
        self._registry = registry
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect("\0" + address)
        self._send_lock = threading.Lock()
        self._send({"op": "hello", "pid": os.getpid(), "role": role})
        threading.Thread(target=self._serve, name="inferwatch-peer", daemon=True).start()
        atexit.register(self._goodbye)

    def _send(self, head: dict[str, Any], body: bytes = b"") -> None:
        with self._send_lock:
            self._sock.sendall(frame(head, body))

    def _serve(self) -> None:
        while True:
            try:
                head, _ = read_frame(self._sock)
                if head.get("op") == "collect":
                    self._send(
                        {"op": "families", "id": head.get("id")}, pack_families(_own_families(self._registry))
                    )
            except (OSError, EOFError, ValueError):
                return  # the owner is gone: so is the endpoint
            except Exception:
                logger.warning(
                    "inferwatch run: a collection for the program's endpoint failed", exc_info=True
                )

    def _goodbye(self) -> None:
        with contextlib.suppress(Exception):
            self._send({"op": "bye"}, pack_families(_own_families(self._registry)))
