"""Frames of a JSON head and a byte body, the messages inferwatch's own processes exchange over local
sockets: the metrics endpoint's helper with its serving process, and the processes of a program that
``inferwatch run`` launched with the one that serves their metrics.

A frame is the head's and the body's lengths (two unsigned 32-bit integers, network order), the head
(a JSON object) and the body.
"""

from __future__ import annotations

import json
import pickle
import socket
import struct
from collections.abc import Iterable
from typing import Any

from inferwatch.common.prerendered import PrerenderedFamily
from prometheus_client.metrics_core import Metric

PREFIX = struct.Struct("!II")
#: The largest head a reader accepts; a longer one is a broken or hostile peer.
MAX_HEAD = 1 << 20


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    """``head`` and ``body`` as one frame."""
    encoded = json.dumps(head, separators=(",", ":")).encode()
    return PREFIX.pack(len(encoded), len(body)) + encoded + body


def parse_head(prefix: bytes) -> tuple[int, int]:
    """The head's and the body's lengths from a frame's prefix; ConnectionError for an oversized head."""
    head_size, body_size = PREFIX.unpack(prefix)
    if head_size > MAX_HEAD:
        raise ConnectionError(f"a frame head of {head_size} bytes")
    return head_size, body_size


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the socket")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """The next frame from a blocking socket (its timeout applies to each read); EOFError once the other
    side has closed, ``TimeoutError`` on the socket's timeout."""
    head_size, body_size = parse_head(_read_exactly(sock, PREFIX.size))
    head = json.loads(_read_exactly(sock, head_size))
    return head, _read_exactly(sock, body_size) if body_size else b""


def pack_families(families: Iterable[Metric], lines: bool = False) -> bytes:
    """Collected metric families as a frame's body: each family's name, help, type, unit and samples,
    pickled as plain tuples (not the collectors' own classes, which the reader may not be able to import);
    a third of what encoding an exposition takes. With ``lines``, a
    :class:`~inferwatch.common.prerendered.PrerenderedFamily` goes as its encoded lines instead (one bytes
    object: a copy, not a pickling per sample), for a reader that encodes them (the endpoint's helper)."""
    packed = [
        (
            f.name,
            f.documentation,
            f.type,
            f.unit,
            f.lines if lines and isinstance(f, PrerenderedFamily) else f.samples,
        )
        for f in families
    ]
    return pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL)


def _content(family: Metric, lines: bool) -> list[Any] | bytes:
    if lines and isinstance(family, PrerenderedFamily):
        return family.lines
    return family.samples


def unpack_families(body: bytes) -> list[Metric]:
    """The families :func:`pack_families` packed. Only for bodies from inferwatch's own processes: the
    body is unpickled."""
    families: list[Metric] = []
    for name, documentation, kind, unit, samples in pickle.loads(body):
        if isinstance(samples, bytes):
            families.append(PrerenderedFamily(name, documentation, kind, unit, samples))
            continue
        family = Metric(name, documentation, kind, unit)
        family.samples = samples
        families.append(family)
    return families
