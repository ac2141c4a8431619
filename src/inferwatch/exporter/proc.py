"""Process names without command lines.

Labels carry a process's ``comm`` (the kernel's 15-character executable name), never its command line:
command lines can hold tokens, passwords and prompts, and their values are unbounded. psutil's ``name()``
is avoided on Linux for this reason: it completes a truncated comm from the command line.
"""

from __future__ import annotations

import sys

import psutil

UNKNOWN = "unknown"


def process_name(pid: int) -> str:
    """The comm of ``pid``, or ``"unknown"`` when it exited or is not visible (another PID namespace)."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
                return comm.read().strip() or UNKNOWN
        except OSError:
            return UNKNOWN
    try:
        return psutil.Process(pid).name() or UNKNOWN
    except psutil.Error:
        return UNKNOWN
