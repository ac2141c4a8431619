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
another request's arrival. transformers makes an id as ``api_server * 2**40 + n`` (its
``make_request_id``), so the slot is picked from both parts (:meth:`ArrivalTable._offset`): from the id
modulo :data:`SLOTS` alone, every API server's n-th request would share one slot.

The table is an anonymous file (``memfd_create``) that the process serving the endpoint holds open; the
others open it through that process's ``/proc/PID/fd/N``, which :data:`ARRIVALS_ENV` names. Nothing of
it is on a file system: it goes with the last process that has it open or mapped, however the program
ends (an exit, a signal, ``SIGKILL``). Where there is no ``memfd_create`` or no ``/proc``, it is a
temporary file, removed at exit (not when the process is killed). This module does not import torch.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import struct
import tempfile
import time
from dataclasses import dataclass

#: The path the table's file is opened by (``/proc/PID/fd/N``, or a temporary file's), set by the process
#: that serves the endpoint, inherited by its descendants.
ARRIVALS_ENV = "INFERWATCH_ARRIVALS_FILE"
#: The temporary file's name prefix, where no anonymous file can be made.
_PREFIX = "inferwatch-arrivals-"
SLOTS = 1 << 16
# transformers' ids: api_server * _IDS_PER_SERVER + n (IDS_PER_API_SERVER in transformers.cli.serving.utils).
_IDS_PER_SERVER = 1 << 40
# Where each API server's requests start in the table: SLOTS / golden ratio, so that the starting points
# of k servers stay far apart (at least 9563 slots for 4 servers, 2251 for 16); a server's requests then
# take consecutive slots from its own start, and requests of servers that go at similar rates never
# meet while they are in flight.
_SERVER_STRIDE = 40503
_SLOT = struct.Struct("<qdd")  # the request's id, its arrival time, its last delivery (NaN: none yet)
_DELIVERED = struct.Struct("<d")
_DELIVERED_OFFSET = struct.calcsize("<qd")
_EMPTY = -1

logger = logging.getLogger(__name__)


def shared_clock() -> bool:
    """Whether ``time.perf_counter()`` reads one clock for every process of the machine."""
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


@dataclass(frozen=True)
class TableFile:
    """A new table's file: the ``path`` the program's processes open it by, the descriptor that keeps an
    anonymous one alive (held by its creator for the program's life), and whether ``path`` is a temporary
    file that its creator must remove."""

    path: str
    fd: int | None
    temporary: bool


def create_table_file() -> TableFile:
    """A new, empty table's file: anonymous where the system allows (nothing to remove, nothing left
    behind), else a temporary file."""
    empty = _SLOT.pack(_EMPTY, 0.0, math.nan) * SLOTS
    try:
        fd = os.memfd_create("inferwatch-arrivals")  # close-on-exec: children open the path instead
    except (AttributeError, OSError):  # not Linux, or a kernel or sandbox without it
        fd = None
    if fd is not None:
        try:
            os.write(fd, empty)
            path = f"/proc/{os.getpid()}/fd/{fd}"
            if os.stat(path).st_size == len(empty):  # /proc is there, and names this file
                return TableFile(path, fd, temporary=False)
        except OSError:
            pass
        os.close(fd)
    fd, path = tempfile.mkstemp(prefix=_PREFIX)
    try:
        os.write(fd, empty)
    finally:
        os.close(fd)
    return TableFile(path, None, temporary=True)


class ArrivalTable:
    """The table of one program, mapped from its file; ``put`` and ``get`` are a few microseconds."""

    def __init__(self, path: str) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), _SLOT.size * SLOTS)

    @staticmethod
    def _offset(request_id: int) -> int:
        server, number = divmod(request_id, _IDS_PER_SERVER)
        return ((number + server * _SERVER_STRIDE) % SLOTS) * _SLOT.size

    def put(self, request_id: int, arrived: float) -> None:
        """Record that request ``request_id`` arrived at ``arrived`` (``time.perf_counter()``)."""
        _SLOT.pack_into(self._map, self._offset(request_id), request_id, arrived, math.nan)

    def get(self, request_id: int) -> float | None:
        """When request ``request_id`` arrived, if the table has it."""
        held, arrived, _ = _SLOT.unpack_from(self._map, self._offset(request_id))
        return arrived if held == request_id else None

    def put_delivery(self, request_id: int, at: float) -> None:
        """The API process handed a chunk of request ``request_id``'s response to its server at ``at``
        (a write into its own slot only, while the slot is still the request's)."""
        offset = self._offset(request_id)
        if _SLOT.unpack_from(self._map, offset)[0] == request_id:
            _DELIVERED.pack_into(self._map, offset + _DELIVERED_OFFSET, at)

    def delivered(self, request_id: int) -> float | None:
        """When the last chunk of request ``request_id``'s response was handed to the server, if the table
        has it and one was."""
        held, _, at = _SLOT.unpack_from(self._map, self._offset(request_id))
        return at if held == request_id and not math.isnan(at) else None


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
            except (OSError, ValueError) as exc:
                # The owner gone, or its /proc closed to this process: say so, or every TTFT here would
                # quietly lose its time in the API process.
                logger.warning(
                    "inferwatch: the program's arrival table %s cannot be opened (%s): requests in this "
                    "process are timed from their entry into the engine, not from their arrival",
                    path,
                    exc,
                )
    return _table
