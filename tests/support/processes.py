"""Running the ``inferwatch`` command as a real process, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.support.reaper import forget, kill_with_this_process

#: The ``inferwatch`` command of this interpreter's installation.
INFERWATCH = (sys.executable, "-m", "inferwatch.cli")


@dataclass
class Process:
    """A started process whose output goes to files, read back with :meth:`stdout` / :meth:`stderr`."""

    popen: subprocess.Popen
    stdout_path: Path
    stderr_path: Path

    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit status; on a time-out the error quotes the process's output."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.popen.args!r} still running after {timeout}s\n"
                f"stdout:\n{self.stdout()}\nstderr:\n{self.stderr()}"
            ) from None


@contextmanager
def spawn(
    args: Sequence[str], workdir: Path, *, env: Mapping[str, str] | None = None, name: str = "process"
) -> Iterator[Process]:
    """Start ``args`` in its own session (so a kill reaches its children); kill it at the end if it is
    still running, and with the test process if that ends first (:mod:`.reaper`)."""
    stdout_path, stderr_path = workdir / f"{name}.out", workdir / f"{name}.err"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        popen = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env={**os.environ, **(env or {})},
            cwd=workdir,
            start_new_session=True,
        )
    kill_with_this_process(popen.pid)
    try:
        yield Process(popen, stdout_path, stderr_path)
    finally:
        with suppress(ProcessLookupError):  # its first process may be gone, and others of the group not
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=30)
        forget(popen.pid)


def run(
    args: Sequence[str], workdir: Path, *, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> tuple[int, str, str]:
    """Run ``args`` to completion: exit status, stdout, stderr."""
    with spawn(args, workdir, env=env) as process:
        status = process.wait(timeout)
        return status, process.stdout(), process.stderr()
