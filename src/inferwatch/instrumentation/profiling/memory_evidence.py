"""Memory evidence on CUDA: allocation history for a capture's window, and "arm for the next OOM".

Recording the CUDA allocator's history (``torch.cuda.memory._record_memory_history``) cost 27-36 % of
decode throughput on the H200 while it was on, so it is never on by default: only during a capture that
asks for it (``POST /debug/profile?memory=1``) and during an armed period (``POST /debug/oom?seconds=T``,
at most ``INFERWATCH_PROFILE_OOM_ARM_MAX_SECONDS``), each bounded to
``INFERWATCH_PROFILE_MEMORY_MAX_ENTRIES`` events (a ring: the latest are kept), with Python stacks only
(C++ frames cost more and say less about a model server). Overlapping users share one recording, which
stops when the last one ends.

An OOM inside an armed period is caught by the allocator's out-of-memory observer, which torch calls
before it raises, with the failed allocation's state intact: the observer writes the allocator summary
(``torch.cuda.memory_summary()``, what the notes tell the reader to look at after an OOM) and the snapshot
(a pickle that https://pytorch.org/memory_viz opens), counts the OOM, and keeps the file names for
``GET /debug/oom``. The snapshot takes 0.55-0.97 s on the H200
(measured): paid once per OOM, by the request that failed anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from inferwatch.common.lograte import RateLimit
from inferwatch.instrumentation.profiling.files import FILE_PREFIX, prune

log = logging.getLogger(__name__)
log.addFilter(RateLimit())

# Oldest OOM files kept in the answers' history.
_KEPT = 8


def cuda_ready() -> bool:
    """Whether this process uses CUDA (without initializing it)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class MemoryEvidence:
    """The allocator's history recording, shared by capture windows and an armed period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._observer_attached = False
        self.armed_until: float | None = None  # time.monotonic()
        self.directory: Path | None = None
        self._keep = 1  # capture files kept in the directory (ProfileConfig.max_files)
        self.ooms = 0
        self.files: list[dict[str, Any]] = []
        self._timer: threading.Timer | None = None

    # -- recording, shared ---------------------------------------------------------------------------------

    def start_recording(self, max_entries: int) -> None:
        import torch

        with self._lock:
            if self._users == 0:
                torch.cuda.memory._record_memory_history(
                    "all", context="all", stacks="python", max_entries=max_entries, clear_history=True
                )
            self._users += 1

    def stop_recording(self) -> None:
        import torch

        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                torch.cuda.memory._record_memory_history(None)

    def snapshot(self, path: Path) -> int:
        """Write the allocator's snapshot (with the history recorded so far) to ``path``; its bytes."""
        import torch

        snapshot = torch.cuda.memory._snapshot()
        with path.open("wb") as sink:
            pickle.dump(snapshot, sink)
        return path.stat().st_size

    # -- arming for the next OOM -------------------------------------------------------------------------

    def arm(self, seconds: float, max_entries: int, directory: Path, keep: int) -> None:
        """Record history for ``seconds`` (from now; arming again extends or shortens the period)."""
        import torch

        with self._lock:
            was_armed = self.armed_until is not None
            self.armed_until, self.directory, self._keep = time.monotonic() + seconds, directory, keep
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
            if not self._observer_attached:
                # There is no way to detach an observer: it stays, and does nothing while disarmed.
                torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
                self._observer_attached = True
        if not was_armed:
            self.start_recording(max_entries)

    def disarm(self) -> None:
        with self._lock:
            if self.armed_until is None:
                return
            self.armed_until = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self.stop_recording()

    def _expire(self) -> None:
        with contextlib.suppress(Exception):
            self.disarm()

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """torch's out-of-memory observer: runs on the allocating thread, before the OOM is raised."""
        if self.armed_until is None or self.directory is None:
            return
        try:
            import torch

            self.ooms += 1
            self.directory.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            stem = f"{FILE_PREFIX}{os.getpid()}-{stamp}-oom{self.ooms}"
            summary = self.directory / f"{stem}-summary.txt"
            summary.write_text(
                f"out of memory on cuda:{device}: {alloc} bytes asked for, {device_alloc} allocated, "
                f"{device_free} free on the device\n\n{torch.cuda.memory_summary(device)}\n",
                encoding="utf-8",
            )
            snapshot = self.directory / f"{stem}-memory.pickle"
            size = self.snapshot(snapshot)
            stats = torch.cuda.memory_stats(device)
            self.files.append(
                {
                    "time": time.time(),
                    "device": device,
                    "summary": summary.name,
                    "snapshot": snapshot.name,
                    "bytes": size,
                    # The allocator's own totals at the OOM, to check the snapshot's against.
                    "allocated_bytes": stats.get("allocated_bytes.all.current"),
                    "reserved_bytes": stats.get("reserved_bytes.all.current"),
                }
            )
            del self.files[:-_KEPT]
            prune(self.directory, self._keep)
        except Exception as exc:  # an observer must never raise into the allocator
            log.warning("could not write the OOM evidence: %r", exc)

    def state(self) -> dict[str, Any]:
        left = None if self.armed_until is None else max(0.0, self.armed_until - time.monotonic())
        return {"armed": left is not None, "armed_seconds_left": left, "ooms": self.ooms, "files": self.files}


#: The process's memory evidence.
MEMORY = MemoryEvidence()
