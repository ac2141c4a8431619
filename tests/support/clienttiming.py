"""Clients in the test process time requests without the test process's garbage-collection pauses.

A test compares what the server measured with what its clients measured in the same run. The clients
that run inside pytest share its process with torch, transformers and every object the session has made,
so a full (generation 2) collection of that heap stops every thread for a long time: 26-242 ms each,
twelve of them during three serving test modules on the 2-core development machine (a ``gc.callbacks``
timer in the pytest process). One such pause between a client's request and its first chunk adds to
what the client measured, never to what the server did: the cause of TTFT comparisons that failed by
50-60 ms, a client's first chunk late while its total was on time. A client program of its own, as users
run one, does not carry that heap. So while any client of this process is timing a request, the cyclic
collector waits (reference counting still frees everything else); it runs again once the last one is done.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_timing = 0  # clients timing a request now
_was_enabled = False  # whether the collector ran before the first of them began


@contextmanager
def without_gc_pauses() -> Iterator[None]:
    """Hold off the cyclic garbage collector for the block; concurrent blocks (one per client thread)
    nest, and the collector is restored as it was when the last of them ends."""
    global _timing, _was_enabled
    with _lock:
        if _timing == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _timing += 1
    try:
        yield
    finally:
        with _lock:
            _timing -= 1
            if _timing == 0 and _was_enabled:
                gc.enable()
