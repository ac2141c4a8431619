"""Memory a flood of connections leaves behind, given back to the kernel: for a process that is there
only to serve HTTP (the exporter, the instrumentation endpoint's helper process), never a model server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc

# mallopt(3)'s M_MMAP_THRESHOLD, and the value: blocks of 64 KiB and more are mapped, and unmapped when freed.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 64 * 1024
_TRIM_SECONDS = 5.0


def return_freed_memory() -> None:
    """Make glibc give large freed blocks back to the kernel for the life of the process.

    glibc serves a block over its mmap threshold from a mapping of its own, unmapped when freed, but
    raises the threshold at every such free (up to 32 MiB): after a flood of connections their buffers
    (asyncio's 256 KiB TLS buffer, answers being written) come from the heap, and the flood's peak stays
    resident. Setting the threshold fixes it (docs/benchmarks.md, "Hostile clients"). Only for a process
    of its own: the instrumentation endpoint's helper process does it, a model server's process never.
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


async def trim_freed_memory() -> None:
    """Every few seconds, collect garbage and give the heap's free pages back to the kernel
    (``malloc_trim``): the smaller blocks a flood of connections leaves freed (reads, parsed requests)
    are holes glibc otherwise keeps resident. A few milliseconds for a few tens of MB."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    while True:
        await asyncio.sleep(_TRIM_SECONDS)
        gc.collect()  # a closed connection is reference cycles (uvicorn's protocol and request cycles)
        trim(0)
