"""Single keys from the terminal, for the live mode of ``inferwatch top`` (``v`` switches the view).

The terminal is put in cbreak mode (a key arrives without Enter, Ctrl-C still interrupts) and restored on
exit; where stdin is not a terminal there are no keys and waiting is a plain sleep.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Waits up to the given seconds for a key; returns it, or None when none came (or one that is not a
#: printable character: an arrow's escape sequence, say).
KeyReader = Callable[[float], "str | None"]


@contextmanager
def terminal_keys() -> Iterator[KeyReader]:
    """A reader of single keys from stdin, in cbreak mode while the context lasts."""
    if not sys.stdin.isatty():
        yield time.sleep  # returns None: no key
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(seconds: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], max(0.0, seconds))
        if not ready:
            return None
        typed = os.read(fd, 32).decode(errors="replace")
        return typed if len(typed) == 1 and typed.isprintable() else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
