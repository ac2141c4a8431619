"""The tests' own process starters: what they start dies with the test process, however that ends (a
``timeout`` around pytest kills it with SIGTERM or SIGKILL, and no ``finally`` of it runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import REPO_ROOT
from tests.support.services import wait_until

pytestmark = pytest.mark.integration

# A test process in miniature: it starts a server the way the serving tests do (tests.support.processes'
# spawn: a session of its own), says so, and is killed in the middle of its test.
_TEST = """
import sys, time
from pathlib import Path
from tests.support.processes import spawn
workdir = Path(sys.argv[1])
with spawn([sys.executable, "-c", sys.argv[2]], workdir, name="server") as server:
    print(server.popen.pid, flush=True)
    time.sleep(120)
"""
# The server: it starts a process of its own (an engine), says its id, and waits.
_SERVER = """
import subprocess, sys, time
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(engine.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("death", ["SIGKILL", "SIGTERM"])
def test_a_server_and_its_children_die_with_a_killed_test_process(tmp_path: Path, death: str) -> None:
    test = subprocess.Popen(
        [sys.executable, "-c", _TEST, str(tmp_path), _SERVER],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert test.stdout is not None
        server = int(test.stdout.readline())
        out = tmp_path / "server.out"
        engine = int(wait_until(lambda: out.exists() and out.read_text().strip(), 30, "the engine's id"))
        assert not _gone(server) and not _gone(engine)
        test.send_signal(getattr(signal, death))
        assert test.wait(10) == -getattr(signal, death)
        wait_until(lambda: _gone(server) and _gone(engine), 10, "the server and its engine to die")
    finally:
        test.kill()
        test.wait()
        for pid in (locals().get("server"), locals().get("engine")):
            if isinstance(pid, int) and not _gone(pid):
                os.kill(pid, signal.SIGKILL)
