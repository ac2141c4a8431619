"""Arrivals handed from the processes that receive requests to the process that runs them.

With ``transformers serve`` from 5.25, a request arrives in an API process and runs in the engine
process; what joins them is the request's id, which the API process makes and the engine receives. The
API process writes each request's arrival time into a table in a file both map (:class:`ArrivalTable`),
at the request's id, before it sends the request; the engine reads it when the request comes in, and
times the request from there: TTFT, end-to-end latency and queue time as the user waits them.

Times are ``time.perf_counter()``, which on Linux is the system-wide monotonic clock, the same in every
process of the machine (:func:`shared_clock`). The table has :data:`SLOTS` slots, a request's id picks
one; a slot holds the id beside the time, so a request whose slot was taken over by a later one (more
than :data:`SLOTS` requests in between) is timed from its entry into the engine instead, never from
another request's arrival. This module does not import torch.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time

#: The table's file, created by the process that serves the endpoint, inherited by its descendants.
ARRIVALS_ENV = "INFERWATCH_ARRIVALS_FILE"
SLOTS = 1 << 16
_SLOT = struct.Struct("<qd")  # the request's id, its arrival time
_EMPTY = -1


def shared_clock() -> bool:
    """Whether ``time.perf_counter()`` reads one clock for every process of the machine."""
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


def create_table_file() -> str:
    """A new, empty table's file (the caller removes it)."""
    fd, path = tempfile.mkstemp(prefix="inferwatch-arrivals-")
    try:
        os.write(fd, _SLOT.pack(_EMPTY, 0.0) * SLOTS)
    finally:
        os.close(fd)
    return path


class ArrivalTable:
    """The table of one program, mapped from its file; ``put`` and ``get`` are a few microseconds."""

    def __init__(self, path: str) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), _SLOT.size * SLOTS)

    @staticmethod
    def _offset(request_id: int) -> int:
        return (request_id % SLOTS) * _SLOT.size

    def put(self, request_id: int, arrived: float) -> None:
        """Record that request ``request_id`` arrived at ``arrived`` (``time.perf_counter()``)."""
        _SLOT.pack_into(self._map, self._offset(request_id), request_id, arrived)

    def get(self, request_id: int) -> float | None:
        """When request ``request_id`` arrived, if the table has it."""
        held, arrived = _SLOT.unpack_from(self._map, self._offset(request_id))
        return arrived if held == request_id else None


_table: ArrivalTable | None = None
_table_tried = False


def program_table() -> ArrivalTable | None:
    """The table of the program this process belongs to (``inferwatch run`` made one), or None."""
    global _table, _table_tried
    if not _table_tried:
        _table_tried = True
        path = os.environ.get(ARRIVALS_ENV)
        if path and shared_clock():
            try:
                _table = ArrivalTable(path)
            except (OSError, ValueError):
                _table = None
    return _table
