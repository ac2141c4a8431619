"""Process groups the tests start die with the test process, however it ends.

The process starters of :mod:`tests.support` start each program in a session of its own (so that a kill
of its group reaches its children: ``inferwatch run -- transformers serve``'s engine, helper and resource
tracker) and kill that group when the test leaves it. A test process that is killed itself (``timeout``
around pytest, a CI job cancelled, a Ctrl-C twice) runs none of that, and the groups, being sessions of
their own, get none of the signals sent to pytest's group: servers stayed behind, holding memory, ports
and files.

So each test process that starts a group also starts one **reaper**: a small Python process in a session
of its own, reading the process groups to kill from a pipe whose only writer is the test process. When
the test process ends, by any means, SIGKILL included, the kernel closes the pipe, and the reaper kills
every group it still holds, then exits. A group the test stopped itself is forgotten first (its id could
be reused). The kernel's ``PR_SET_PDEATHSIG`` would reach only the group's first process, and fires when
the *thread* that started it ends, which a test's helper thread may do long before the test process.

What is not covered: a process group started in the microseconds between ``Popen`` returning and its
id reaching the pipe, and a process of a group that leaves it (``setsid``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
from typing import IO

# Reads "+PGID" (kill this group when the pipe closes) and "-PGID" (forget it) lines until the pipe closes;
# then kills what it holds. It imports nothing but the standard library, and no site packages (-S).
_REAPER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    try:
        sign, pgid = line[0], int(line[1:])
    except ValueError:
        continue
    if sign == "+":
        groups.add(pgid)
    else:
        groups.discard(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_reaper: subprocess.Popen[str] | None = None  # held: a collected Popen warns that it still runs
_pipe: IO[str] | None = None
_owner: int | None = None  # the process that started the reaper (a forked child starts its own)
_groups: set[int] = set()  # what the reaper holds


def _reaper_pipe() -> IO[str]:
    """(lock held) The pipe to this process's reaper, started at the first call."""
    global _reaper, _pipe, _owner
    if _pipe is None or _owner != os.getpid():
        reaper = _reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # none of the signals sent to the test process's group reach it
        )
        assert reaper.stdin is not None
        _pipe, _owner = reaper.stdin, os.getpid()
    return _pipe


def _send(line: str) -> None:
    """(lock held) Tell the reaper; one that was killed is replaced, and given every group held."""
    global _pipe
    try:
        pipe = _reaper_pipe()
        pipe.write(line + "\n")
        pipe.flush()
    except BrokenPipeError:
        _pipe = None
        pipe = _reaper_pipe()
        pipe.write("".join(f"+{pgid}\n" for pgid in _groups))
        pipe.flush()


def kill_with_this_process(pgid: int) -> None:
    """Kill process group ``pgid`` when this process ends, unless :func:`forget` is called first."""
    with _lock:
        if _owner != os.getpid():
            _groups.clear()  # a forked child: its parent's groups are its parent's
        _groups.add(pgid)
        _send(f"+{pgid}")


def forget(pgid: int) -> None:
    """Process group ``pgid`` has ended (the test stopped it): nothing to kill."""
    with _lock:
        if pgid in _groups and _owner == os.getpid():
            _groups.discard(pgid)
            _send(f"-{pgid}")


@atexit.register
def _release() -> None:
    """At a normal exit, let the reaper kill what is left and go (closing the pipe is its signal)."""
    if _pipe is not None and _owner == os.getpid():
        with contextlib.suppress(OSError):
            _pipe.close()
