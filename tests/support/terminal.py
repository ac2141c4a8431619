"""A program in a real terminal of a given size (a detached tmux session), and its screen as drawn.

The program sees a terminal (``isatty``, the window's size, cbreak mode for keys), not a pipe, and tmux
draws what it writes as a terminal emulator does (cursor moves, the alternate screen, wrapping): what
``capture-pane`` returns is what a person sees in a terminal of that size. Each session has its own tmux
server (its own socket), killed at the end with the program.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.services import require_binary


@dataclass(frozen=True)
class Terminal:
    """The screen and keyboard of a program running in a tmux session."""

    tmux: tuple[str, ...]  # the tmux command on this session's own server

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.tmux, *args], capture_output=True, text=True, timeout=30, check=False)

    def lines(self) -> list[str]:
        """The screen now, one string per line, trailing blanks removed."""
        captured = self._run("capture-pane", "-p", "-t", "top")
        return [line.rstrip() for line in captured.stdout.split("\n")]

    def press(self, key: str) -> None:
        self._run("send-keys", "-t", "top", "-l", key)

    def running(self) -> bool:
        return self._run("has-session", "-t", "top").returncode == 0

    def wait_for(self, shown: Callable[[list[str]], bool], timeout: float, what: str) -> list[str]:
        """The screen once ``shown`` holds for it and two captures agree (not one taken mid-draw); a
        time-out quotes the last one."""
        deadline = time.monotonic() + timeout
        previous: list[str] = []
        while True:
            screen = self.lines()
            if screen == previous and shown(screen):
                return screen
            previous = screen
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; screen:\n" + "\n".join(screen)
                )
            time.sleep(0.2)


@contextmanager
def in_terminal(
    args: Sequence[str], columns: int, lines: int, workdir: Path, env: Mapping[str, str] | None = None
) -> Iterator[Terminal]:
    """Run ``args`` in a terminal of ``columns`` x ``lines``; stop it and its tmux server at the end."""
    tmux = (require_binary("tmux"), "-S", str(workdir / f"tmux-{columns}x{lines}.sock"), "-f", os.devnull)
    # The size comes from the terminal alone, as in a real one.
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TMUX")}
    environ.update(env or {})
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(lines), *args],
        env=environ,
        check=True,
        timeout=30,
    )
    try:
        yield Terminal(tmux)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30, check=False)
