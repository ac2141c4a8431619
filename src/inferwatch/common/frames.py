"""Frames of a JSON head and a byte body, the messages inferwatch's own processes exchange over local
sockets: the metrics endpoint's helper with its serving process, and the processes of a program that
``inferwatch run`` launched with the one that serves their metrics.

A frame is the head's and the body's lengths (two unsigned 32-bit integers, network order), the head
(a JSON object) and the body. Collected metric families travel as data only (:func:`pack_families`):
JSON that the stdlib's parser reads and :func:`unpack_families` checks field by field, never a format
that can make its reader run code, since any process of the same user can reach the program's hub
(issue 48).
"""

from __future__ import annotations

import json
import math
import re
import socket
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample, Timestamp

from inferwatch.common.prerendered import PrerenderedFamily

PREFIX = struct.Struct("!II")
#: The largest head a reader accepts unless told otherwise; a longer one is a broken or hostile peer.
MAX_HEAD = 1 << 20
# A packed collection: the JSON's length, the JSON, then the prerendered families' lines.
_PACKED = struct.Struct("!I")
# The most a reader asks the kernel for at once.
_CHUNK = 1 << 20
# Timestamps (seconds) a sample may carry: an int64 of milliseconds, as Prometheus keeps them.
_LATEST_TIMESTAMP = 9.2e15
# A unit goes into OpenMetrics' ``# UNIT`` line as it is.
_UNIT = re.compile(r"[a-zA-Z0-9_:]*")


class ProtocolError(ValueError):
    """A frame or a message that breaks the protocol: out of bounds, too slow, or of the wrong shape."""


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    """``head`` and ``body`` as one frame."""
    encoded = json.dumps(head, separators=(",", ":")).encode()
    return PREFIX.pack(len(encoded), len(body)) + encoded + body


def parse_prefix(prefix: bytes, max_head: int = MAX_HEAD, max_body: int | None = None) -> tuple[int, int]:
    """The head's and the body's lengths from a frame's prefix; ProtocolError beyond the bounds."""
    head_size, body_size = PREFIX.unpack(prefix)
    if head_size > max_head:
        raise ProtocolError(f"a frame head of {head_size} bytes (at most {max_head})")
    if max_body is not None and body_size > max_body:
        raise ProtocolError(f"a frame body of {body_size} bytes (at most {max_body})")
    return head_size, body_size


def parse_head(data: bytes) -> dict[str, Any]:
    """A frame's head; ProtocolError for anything but a JSON object (nested too deep included)."""
    try:
        head = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a frame head that is not JSON: {exc}") from None
    if not isinstance(head, dict):
        raise ProtocolError(f"a frame head that is a JSON {type(head).__name__}, not an object")
    return head


class FrameReader:
    """Frames read from a socket as their bytes come, each bounded (``max_head``, ``max_body``: checked
    on the prefix, before anything else is read) and due whole within ``timeout`` seconds of its first
    byte, or of ``started`` where given (a hello is due from the connection's start). It never reads
    past the frame it is on, so what it holds is at most one frame."""

    def __init__(
        self,
        max_head: int,
        max_body: int | None,
        timeout: float = math.inf,
        started: float | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_head = max_head
        self._max_body = max_body
        self._timeout = timeout
        self._now = now
        self._started = started
        self._parts: list[bytes] = []
        self._have = 0
        self._need = PREFIX.size
        self._head_size: int | None = None  # known once the prefix is in

    def overdue(self, now: float) -> bool:
        """Whether the frame begun (or due since ``started``) has run past its time."""
        return self._started is not None and now - self._started > self._timeout

    def due_in(self, now: float) -> float:
        """Seconds until :meth:`overdue` (infinite while no frame is begun)."""
        return math.inf if self._started is None else max(0.0, self._started + self._timeout - now)

    def read(self, sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
        """One ``recv`` of what the frame still needs: the frame once it is whole, else None.
        ``EOFError`` once the other side has closed, ProtocolError for a frame out of bounds or of a
        head that is not a JSON object, and on a non-blocking socket ``BlockingIOError`` when nothing
        has come."""
        chunk = sock.recv(min(self._need - self._have, _CHUNK))
        if not chunk:
            raise EOFError("the other side closed the socket")
        if self._started is None:
            self._started = self._now()
        self._parts.append(chunk)
        self._have += len(chunk)
        if self._have < self._need:
            return None
        data = b"".join(self._parts)
        self._parts, self._have = [], 0
        if self._head_size is None:
            self._head_size, body_size = parse_prefix(data, self._max_head, self._max_body)
            self._need = self._head_size + body_size
            if self._need:
                return None
        head_size = self._head_size
        self._head_size, self._need, self._started = None, PREFIX.size, None
        return parse_head(data[:head_size]), data[head_size:]


def read_frame(
    sock: socket.socket, max_head: int = MAX_HEAD, max_body: int | None = None
) -> tuple[dict[str, Any], bytes]:
    """The next frame from a blocking socket (its timeout applies to each read); EOFError once the other
    side has closed, ``TimeoutError`` on the socket's timeout, ProtocolError as :class:`FrameReader`."""
    reader = FrameReader(max_head, max_body)
    while True:
        whole = reader.read(sock)
        if whole is not None:
            return whole


def _plain(value: Any) -> float:
    """What JSON cannot write of a sample: a ``Timestamp`` goes as its seconds."""
    if isinstance(value, Timestamp):
        return float(value)
    raise TypeError(f"a {type(value).__name__} in a metric sample")


def pack_families(families: Iterable[Metric], lines: bool = False) -> bytes:
    """Collected metric families as a frame's body: a JSON list of each family's name, help, type, unit
    and samples (each sample as prometheus_client's ``Sample`` tuple: name, labels, value, timestamp,
    exemplar and native histogram, which :func:`unpack_families` keeps as it says). With ``lines``, a
    :class:`~inferwatch.common.prerendered.PrerenderedFamily` goes as its encoded lines instead, after the
    JSON (one copy of bytes, not an encoding per sample), for a reader that trusts and encodes them (the
    endpoint's helper)."""
    described: list[list[Any]] = []
    tail: list[bytes] = []
    for family in families:
        if lines and isinstance(family, PrerenderedFamily):
            content: Any = len(family.lines)
            tail.append(family.lines)
        else:
            content = family.samples
        described.append([family.name, family.documentation, family.type, family.unit, content])
    encoded = json.dumps(described, separators=(",", ":"), ensure_ascii=False, default=_plain).encode()
    return b"".join([_PACKED.pack(len(encoded)), encoded, *tail])


def _text(value: Any) -> bool:
    """Whether ``value`` is a string an exposition can be written with (JSON may carry lone surrogates)."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _number(value: Any) -> float | None:
    """``value`` as the float an encoder writes, or None for anything else: not a number (a JSON
    ``true`` is none), or an integer beyond any float."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _sample(entry: Any, trusted: bool) -> Sample | None:
    """A sample from its JSON; None for one the wire does not carry (a native histogram's). The hot loop
    of a hub's collection: its strings are checked in one concatenation (which also fails on any that is
    not a string). Only a ``trusted`` sender's exemplars are kept: OpenMetrics' encoder writes their label
    names as they are, and fails on one outside a counter or a histogram's buckets."""
    if type(entry) is not list or not 3 <= len(entry) <= 6:
        raise ProtocolError("a sample that is not a list of its name, labels and value")
    name, labels, value = entry[0], entry[1], entry[2]
    if type(labels) is not dict:
        raise ProtocolError(f"sample {name!r}: labels that are not an object")
    try:
        text = name + "".join(labels) + "".join(labels.values())
    except TypeError:
        raise ProtocolError(f"sample {name!r}: a name or label that is not a string") from None
    if not _text(text):
        raise ProtocolError(f"sample {name!r}: a string that cannot be written as UTF-8")
    number = _number(value)
    if number is None:
        if value is None and len(entry) == 6 and entry[5] is not None:
            return None
        raise ProtocolError(f"sample {name!r}: a value that is not a number")
    timestamp = _timestamp(entry[3]) if len(entry) > 3 else None
    exemplar = _exemplar(entry[4]) if trusted and len(entry) > 4 else None
    return Sample(name, labels, number, timestamp, exemplar)


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    seconds = _number(value)
    # The text format writes milliseconds as an integer: beyond this, no clock's, and inf fails.
    if seconds is None or not abs(seconds) < _LATEST_TIMESTAMP:
        raise ProtocolError("a timestamp that is not a number of seconds")
    return seconds


def _exemplar(entry: Any) -> Exemplar | None:
    if entry is None:
        return None
    if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not dict:
        raise ProtocolError("an exemplar that is not its labels, value and timestamp")
    labels, value, timestamp = entry
    if not all(_text(key) and _text(label) for key, label in labels.items()):
        raise ProtocolError("an exemplar whose labels are not strings")
    number = _number(value)
    if number is None:
        raise ProtocolError("an exemplar whose value is not a number")
    return Exemplar(labels, number, _timestamp(timestamp))


def unpack_families(body: bytes, trusted: bool = False) -> list[Metric]:
    """The families :func:`pack_families` packed, every field checked: ProtocolError for anything else
    (not JSON, nested too deep, a wrong type or shape anywhere). Prerendered lines and exemplars are
    kept only from a ``trusted`` sender (the serving process, for its helper): lines go into an
    exposition as they are. Native histograms are not carried (prometheus_client's own metrics make
    none)."""
    if len(body) < _PACKED.size:
        raise ProtocolError("a collection shorter than its length")
    (size,) = _PACKED.unpack_from(body)
    try:
        described = json.loads(body[_PACKED.size : _PACKED.size + size])
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a collection that is not JSON: {exc}") from None
    if type(described) is not list:
        raise ProtocolError("a collection that is not a list of families")
    offset = _PACKED.size + size
    families: list[Metric] = []
    for entry in described:
        if type(entry) is not list or len(entry) != 5 or not all(_text(field) for field in entry[:4]):
            raise ProtocolError("a family that is not its name, help, type, unit and samples")
        name, documentation, kind, unit, content = entry
        if not _UNIT.fullmatch(unit):
            raise ProtocolError(f"family {name!r}: a unit that is not a word")
        try:
            if trusted and type(content) is int and 0 <= content <= len(body) - offset:
                families.append(
                    PrerenderedFamily(name, documentation, kind, unit, body[offset : offset + content])
                )
                offset += content
                continue
            family = Metric(name, documentation, kind, unit)
        except ValueError as exc:  # prometheus_client's checks of the name, type and unit
            raise ProtocolError(f"family {name!r}: {exc}") from None
        if type(content) is not list:
            raise ProtocolError(f"family {name!r}: samples that are not a list")
        family.samples = [sample for sample in (_sample(e, trusted) for e in content) if sample is not None]
        families.append(family)
    if offset != len(body):
        raise ProtocolError("a collection with bytes beyond its families")
    return families
