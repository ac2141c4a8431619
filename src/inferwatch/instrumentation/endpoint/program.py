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

What the hub trusts: the kernel's word on who connected (``SO_PEERCRED``: another user's process is
refused), nothing a peer says. Its socket's name is in ``/proc/net/unix`` for any process of the user to
connect to, so every frame is bounded on its prefix and due whole within :data:`FRAME_TIMEOUT`, every
message is checked against its schema, collections are data (``inferwatch.common.frames``: JSON, never
code), and a peer that breaks any of it is dropped, logged once and counted
(``how="dropped"``); at most :data:`MAX_PEERS` connections are joined or joining, the rest refused and
counted (``inferwatch_run_refused_connections_total``). docs/serving.md says it for users.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from inferwatch.common.frames import (
    FrameReader,
    ProtocolError,
    frame,
    pack_families,
    read_frame,
    unpack_families,
)
from inferwatch.common.lograte import RateLimit

logger = logging.getLogger("inferwatch.run")
#: The hub's lines: any process of the user can make it refuse or drop connections by the thousand.
hub_log = logging.getLogger("inferwatch.run.hub")
hub_log.addFilter(RateLimit())

#: The hub's address (a Linux abstract socket name), set by the owner for its descendants.
HUB_ENV = "INFERWATCH_PROGRAM_HUB"
#: The most bytes one collection of a peer may take on the wire (a larger one drops the peer), and its
#: default: 64 instrumented models in one process send 1.8 MB (docs/benchmarks.md, "The hub's wire
#: format"), a process of transformers serve 40-60 kB.
MAX_COLLECTION_ENV = "INFERWATCH_RUN_MAX_COLLECTION_BYTES"
MAX_COLLECTION = 16 << 20
#: The most processes joined to the hub or joining it at once; a connection beyond is refused. A program
#: has a few (transformers serve: its engine and ``--api-server-count`` API servers); each costs a
#: descriptor and its last collection.
MAX_PEERS = 32
#: Seconds the hub waits for its peers' collections in one endpoint collection; a peer that has not
#: answered by then is served from its last collection (and counted as late).
COLLECT_TIMEOUT = 0.5
#: Seconds a frame gets, whole, from its first byte (a hello: from the connection's acceptance); a peer
#: writes one with one ``sendall``. A frame past it refuses or drops its connection.
FRAME_TIMEOUT = 5.0
# The largest hello's head (its op, pid and role take some 50 bytes), and the heads of later frames.
_MAX_HELLO = 256
_MAX_HEAD = 256
# Seconds the accept loop pauses after accept() failed (out of descriptors, memory), doubled up to the
# second figure while it fails.
_ACCEPT_PAUSES = (0.05, 1.0)
#: Seconds between the hub's looks at whether a peer's socket has closed (a process that died).
WATCH_INTERVAL = 1.0
#: The families a process's registry has about the process itself (prometheus_client's default
#: collectors): the owner's stand for the endpoint; a peer's are left out of the merge.
_OWN_PROCESS_PREFIXES = ("process_", "python_")
# struct ucred: the connecting process's pid, uid and gid, as the kernel vouches for them.
_CREDENTIALS = struct.Struct("3i")
#: The roles a process can have (a bounded label): the owner, a process with models, one serving the API.
ROLES = ("main", "engine", "api", "worker")
#: ``how`` of ``inferwatch_run_process_exits_total``: said goodbye, its socket closed without one, or it
#: broke the protocol (a frame out of bounds or past its time, a message of the wrong shape).
EXITED, DIED, DROPPED = "exited", "died", "dropped"
#: ``reason`` of ``inferwatch_run_refused_connections_total``.
REFUSALS = ("hello", "full", "user")


def max_collection_from_env(environ: Mapping[str, str]) -> int:
    """The bound on a peer's collection, from :data:`MAX_COLLECTION_ENV`; ValueError naming it."""
    text = environ.get(MAX_COLLECTION_ENV, "")
    if not text:
        return MAX_COLLECTION
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 << 16:
        raise ValueError(f"{MAX_COLLECTION_ENV} must be a number of bytes of at least 65536, got {text!r}")
    return value


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


def _message(head: dict[str, Any], fields: dict[str, type]) -> None:
    """ProtocolError unless ``head`` has exactly ``fields``, each of its type (a JSON ``true`` is no
    int)."""
    if head.keys() != fields.keys() or any(type(head[name]) is not kind for name, kind in fields.items()):
        expected = ", ".join(f"{name}: {kind.__name__}" for name, kind in fields.items())
        raise ProtocolError(f"a message {json.dumps(head)[:120]} that is not {{{expected}}}")


def _hello_role(head: dict[str, Any], body: bytes) -> str:
    """The role a hello announces; ProtocolError for anything that is not a hello."""
    _message(head, {"op": str, "pid": int, "role": str})
    if head["op"] != "hello" or head["role"] not in ROLES[1:] or body:  # one main: the owner
        raise ProtocolError(f"a first message {json.dumps(head)[:120]} that is not a hello")
    return head["role"]


@dataclass(eq=False)
class _Peer:
    sock: socket.socket
    pid: int
    role: str
    reader: FrameReader
    last: list[Metric] = field(default_factory=list)  # its last collection
    asked: int | None = None  # the collection it was asked for and has not answered yet
    gone: bool = False


class ProgramHub:
    """The owner's end: accepts the program's processes on an abstract local socket, asks them for their
    collections, and keeps what the gone ones counted. Thread-safe; one lock guards the peers, their
    sockets and what the gone ones left.

    Whatever a connection sends, the serving process only spends bounded memory and time on it: a hello
    is due whole within :data:`FRAME_TIMEOUT` of the connection and at most :data:`_MAX_HELLO` bytes,
    read beside the other connections' (one slow hello delays no other); any later frame is due whole
    within :data:`FRAME_TIMEOUT` of its first byte, a collection at most ``max_collection`` bytes, and
    every message is checked against its schema (collections by
    :func:`~inferwatch.common.frames.unpack_families`: data, never code). A connection that breaks any
    of these is refused (before it joined) or dropped (after), logged at a bounded rate and counted; at
    most ``max_peers`` connections are joined or joining at once."""

    def __init__(self, max_collection: int = MAX_COLLECTION, max_peers: int = MAX_PEERS) -> None:
        global _hub_pid
        _hub_pid = os.getpid()
        self.max_collection = max_collection
        self._max_peers = max_peers
        self.address = f"inferwatch-{os.getpid()}-{secrets.token_hex(8)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._lock = threading.Lock()
        self._peers: list[_Peer] = []
        self._selector = selectors.DefaultSelector()  # the peers' sockets, under the lock
        self._gone: list[Metric] = []  # the counters of every process that has gone, summed
        self._exits: dict[tuple[str, str], int] = {}  # (role, how) -> processes gone that way
        self._late: dict[str, int] = {}  # role -> collections a peer did not answer in time
        self._refused = dict.fromkeys(REFUSALS, 0)  # reason -> connections refused before they joined
        self._asked = 0
        self._closed = False
        threading.Thread(target=self._accept, name="inferwatch-hub", daemon=True).start()
        threading.Thread(target=self._watch, name="inferwatch-hub-watch", daemon=True).start()

    # -- joining (the accept thread) --

    def _accept(self) -> None:
        """Take connections and read their hellos, all at once, until the hub closes. Nothing ends this
        loop but the hub's closing: a bad connection is refused, and a failed ``accept()`` (out of
        descriptors or memory) is retried after a pause that doubles while it fails, the connection
        waiting in the kernel's backlog meanwhile."""
        hellos: dict[socket.socket, tuple[FrameReader, int]] = {}
        pause = _ACCEPT_PAUSES[0]
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._closed:
                try:
                    for key, _ in selector.select(_next_due(reader for reader, _ in hellos.values())):
                        if key.fileobj is self._listener:
                            self._take(selector, hellos)
                        else:
                            self._hello(selector, hellos, key.fileobj)  # type: ignore[arg-type]
                    now = time.monotonic()
                    for sock, (reader, _) in list(hellos.items()):
                        if reader.overdue(now):
                            self._forget_hello(selector, hellos, sock)
                            self._refuse(sock, "hello", f"no hello within {FRAME_TIMEOUT:g} s")
                    pause = _ACCEPT_PAUSES[0]
                except Exception as exc:
                    if self._closed:
                        break
                    hub_log.warning(
                        "inferwatch run: the program's metrics endpoint cannot take connections now (%r); "
                        "trying again in %.2f s",
                        exc,
                        pause,
                    )
                    time.sleep(pause)
                    pause = min(pause * 2, _ACCEPT_PAUSES[1])
            for sock in hellos:
                sock.close()

    def _take(
        self, selector: selectors.BaseSelector, hellos: dict[socket.socket, tuple[FrameReader, int]]
    ) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # taken back by its process before we took it
        try:
            pid, uid, _ = _CREDENTIALS.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
            )
        except OSError:
            sock.close()
            raise
        if uid != os.getuid():  # an abstract socket is open to every user of the machine
            self._refuse(sock, "user", f"process {pid} of user {uid}")
            return
        with self._lock:
            joined = len(self._peers)
        if joined + len(hellos) >= self._max_peers:
            self._refuse(sock, "full", f"process {pid}: {self._max_peers} processes are joined or joining")
            return
        sock.setblocking(False)
        hellos[sock] = (FrameReader(_MAX_HELLO, 0, FRAME_TIMEOUT, started=time.monotonic()), pid)
        selector.register(sock, selectors.EVENT_READ)

    def _hello(
        self,
        selector: selectors.BaseSelector,
        hellos: dict[socket.socket, tuple[FrameReader, int]],
        sock: socket.socket,
    ) -> None:
        reader, pid = hellos[sock]
        try:
            whole = reader.read(sock)
            if whole is None:
                return
            role = _hello_role(*whole)
        except BlockingIOError:
            return
        except Exception as exc:  # a closed socket, a frame out of bounds, anything but a hello
            self._forget_hello(selector, hellos, sock)
            self._refuse(sock, "hello", f"process {pid}: {exc}")
            return
        self._forget_hello(selector, hellos, sock)
        peer = _Peer(sock, pid, role, FrameReader(_MAX_HEAD, self.max_collection, FRAME_TIMEOUT))
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._peers.append(peer)
            self._selector.register(sock, selectors.EVENT_READ, peer)

    @staticmethod
    def _forget_hello(
        selector: selectors.BaseSelector,
        hellos: dict[socket.socket, tuple[FrameReader, int]],
        sock: socket.socket,
    ) -> None:
        selector.unregister(sock)
        del hellos[sock]

    def _refuse(self, sock: socket.socket, reason: str, detail: str) -> None:
        """Count, log (at a bounded rate) and close a connection that does not join; it is told why,
        where its socket takes the words at once."""
        with self._lock:
            self._refused[reason] += 1
        hub_log.warning(
            "inferwatch run: the program's metrics endpoint refused a connection (%s): %s", reason, detail
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(frame({"op": "refused", "reason": reason}))
        sock.close()

    # -- the joined peers (under the lock) --

    def _watch(self) -> None:
        """Notice peers that went away between collections, so that their end is logged when it happens,
        take late answers (fresher than what the peer had sent before), and cut frames past their time."""
        while not self._closed:
            time.sleep(WATCH_INTERVAL)
            with self._lock:
                if self._closed:
                    return
                try:
                    self._take_what_came(0)
                except Exception:  # inferwatch's own error: the next look, and the scrapes, go on
                    hub_log.warning(
                        "inferwatch run: the program's hub failed to read its peers", exc_info=True
                    )

    def _take_what_came(self, timeout: float) -> None:
        """(lock held) Read what the peers have sent within ``timeout`` seconds; drop those whose frame is
        past its time."""
        for key, _ in self._selector.select(timeout):
            self._read(key.data)
        now = time.monotonic()
        for peer in list(self._peers):
            if peer.reader.overdue(now):
                self._retire(peer, DROPPED, f"a frame not whole within {FRAME_TIMEOUT:g} s")

    def _read(self, peer: _Peer) -> None:
        """(lock held) Take what the peer has sent, as far as it has come: an answer, its goodbye, or its
        socket's end."""
        try:
            while not peer.gone:
                whole = peer.reader.read(peer.sock)
                if whole is not None:
                    self._take_message(peer, *whole)
        except BlockingIOError:
            pass
        except ProtocolError as exc:
            self._retire(peer, DROPPED, str(exc))
        except (OSError, EOFError):
            self._retire(peer, DIED)

    def _take_message(self, peer: _Peer, head: dict[str, Any], body: bytes) -> None:
        """(lock held) An answer to the collection the peer was asked for, or its goodbye (with its last
        collection); anything else is a ProtocolError."""
        if head.get("op") == "families":
            _message(head, {"op": str, "id": int})
            if head["id"] != peer.asked:
                raise ProtocolError(f"an answer to collection {head['id']}, not to {peer.asked}")
            peer.last, peer.asked = unpack_families(body), None
        elif head == {"op": "bye"}:
            if body:
                peer.last = unpack_families(body)
            self._retire(peer, EXITED)
        else:
            raise ProtocolError(f"a message {json.dumps(head)[:120]} that is no answer or goodbye")

    def _retire(self, peer: _Peer, how: str, why: str = "") -> None:
        """(lock held) The peer is gone: its counters join the gone ones', its gauges are dropped."""
        peer.gone = True
        self._peers.remove(peer)
        self._selector.unregister(peer.sock)
        peer.sock.close()
        self._gone = merge_families([self._gone, _counting_only(peer.last)])
        key = (peer.role, how)
        self._exits[key] = self._exits.get(key, 0) + 1
        ended = {
            EXITED: "exited",
            DIED: "is gone without a goodbye (killed or crashed)",
            DROPPED: f"broke the protocol of the program's metrics endpoint ({why}): dropped it",
        }[how]
        hub_log.warning(
            "inferwatch run: the %s process %d of the program %s; its counters are kept, its gauges dropped",
            peer.role,
            peer.pid,
            ended,
        )

    def gather(self) -> list[list[Metric]]:
        """Every peer's collection (its last one where it did not answer in time), and the gone ones'. A
        peer still on an earlier collection is not asked again nor waited for: a peer that never answers
        costs one wait of :data:`COLLECT_TIMEOUT`, not one per scrape."""
        with self._lock:
            if self._closed:
                return [self._gone]
            self._take_what_came(0)
            self._asked += 1
            asked = frame({"op": "collect", "id": self._asked})
            waiting = []
            for peer in list(self._peers):
                if peer.asked is not None:
                    self._late[peer.role] = self._late.get(peer.role, 0) + 1
                    continue
                try:
                    sent = peer.sock.send(asked)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._retire(peer, DIED)
                    continue
                if sent != len(asked):  # its socket is full of our requests: it does not read them
                    self._retire(peer, DROPPED, "it does not read its requests")
                    continue
                peer.asked = self._asked
                waiting.append(peer)
            deadline = time.monotonic() + COLLECT_TIMEOUT
            while any(peer.asked is not None and not peer.gone for peer in waiting):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._take_what_came(left)
            for peer in waiting:
                if peer.asked is not None and not peer.gone:
                    self._late[peer.role] = self._late.get(peer.role, 0) + 1
            return [peer.last for peer in self._peers] + [self._gone]

    def self_families(self) -> list[Metric]:
        """The hub's own series: live processes by role, gone ones by role and how, late collections,
        refused connections."""
        with self._lock:
            live = {role: 0 for role in ROLES}
            live["main"] = 1
            for peer in self._peers:
                live[peer.role] += 1
            exits, late, refused = dict(self._exits), dict(self._late), dict(self._refused)
        processes = Metric(
            "inferwatch_run_processes",
            "Processes of the launched program on this endpoint, by role.",
            "gauge",
        )
        for role, count in live.items():
            processes.add_sample("inferwatch_run_processes", {"role": role}, count)
        gone = Metric(
            "inferwatch_run_process_exits",
            "Processes of the launched program that left the endpoint: exited (said goodbye), died, or "
            "dropped (broke the protocol).",
            "counter",
        )
        for (role, how), count in sorted(exits.items()):
            gone.add_sample("inferwatch_run_process_exits_total", {"role": role, "how": how}, count)
        slow = Metric(
            "inferwatch_run_late_collections",
            f"Collections a process did not answer within {COLLECT_TIMEOUT} s, or was not asked for while "
            "it had not answered the one before (its last one was served).",
            "counter",
        )
        for role, count in sorted(late.items()):
            slow.add_sample("inferwatch_run_late_collections_total", {"role": role}, count)
        turned_away = Metric(
            "inferwatch_run_refused_connections",
            "Connections to the program's endpoint refused before they joined: no valid hello in time "
            f"(hello), {self._max_peers} processes joined or joining already (full), another user's (user).",
            "counter",
        )
        for reason, count in refused.items():
            turned_away.add_sample("inferwatch_run_refused_connections_total", {"reason": reason}, count)
        return [processes, gone, slow, turned_away]

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
            self._selector.close()


def _next_due(readers: Iterable[FrameReader]) -> float:
    """Seconds the accept loop may wait: until the next hello is due, and at most :data:`WATCH_INTERVAL`
    (it looks whether the hub has closed)."""
    return min([WATCH_INTERVAL, *(reader.due_in(time.monotonic()) for reader in readers)])


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
        try:
            self._send({"op": "hello", "pid": os.getpid(), "role": role})
        except OSError:
            refusal = self._refusal()
            self._sock.close()
            if refusal is None:
                raise
            raise ConnectionRefusedError(f"it refused this process ({refusal})") from None
        threading.Thread(target=self._serve, name="inferwatch-peer", daemon=True).start()
        atexit.register(self._goodbye)

    def _refusal(self) -> str | None:
        """Why the hub closed the connection before the hello was sent, if it said (at the cap, a
        refused process's hello meets a closed socket, the hub's words in front of it)."""
        with contextlib.suppress(OSError, EOFError, ValueError):
            self._sock.settimeout(1.0)
            head, _ = read_frame(self._sock, _MAX_HEAD, 0)
            if head.get("op") == "refused":
                return str(head.get("reason"))
        return None

    def _send(self, head: dict[str, Any], body: bytes = b"") -> None:
        with self._send_lock:
            self._sock.sendall(frame(head, body))

    def _serve(self) -> None:
        while True:
            try:
                head, _ = read_frame(self._sock, _MAX_HEAD, 0)
                if head.get("op") == "refused":
                    logger.warning(
                        "inferwatch run: the program's metrics endpoint refused this process (pid %d: %s); "
                        "its metrics are not served",
                        os.getpid(),
                        head.get("reason"),
                    )
                    return
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
