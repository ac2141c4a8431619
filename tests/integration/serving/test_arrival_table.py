"""``inferwatch run``'s arrival table (``transformers serve``'s processes hand their requests' arrivals
over in it) leaves nothing behind, however the program ends: an exit, SIGTERM, SIGINT or SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.support.processes import INFERWATCH, spawn
from tests.support.services import wait_until

pytestmark = pytest.mark.integration

# The owner of the table (the program's first process, which serves the endpoint) starts a process as
# transformers serve starts its engine (multiprocessing's spawn), which writes an arrival into the table
# and reads it back; then the owner exits, or waits for the test's signal.
PROGRAM = """
import multiprocessing, os, signal, sys, time

def engine(answers):
    from inferwatch.instrumentation.launcher.transformers_serve.arrivals import program_table
    table = program_table()
    table.put(41, 2.5)
    answers.put(table.get(41))
    time.sleep(60)

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's foreground program has it
    spawn = multiprocessing.get_context("spawn")
    answers = spawn.Queue()
    child = spawn.Process(target=engine, args=(answers,), daemon=True)
    child.start()
    print("shared", answers.get(timeout=60), os.environ["INFERWATCH_ARRIVALS_FILE"], flush=True)
    if sys.argv[1] == "exit":
        child.terminate()
        sys.exit(0)
    time.sleep(60)
"""


@pytest.mark.parametrize("end", ["exit", "SIGTERM", "SIGINT", "SIGKILL"])
def test_no_end_of_the_program_leaves_its_arrival_table_behind(tmp_path: Path, end: str) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM, encoding="utf-8")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    command = [*INFERWATCH, "run", "--port=0", "--", sys.executable, str(program), end]
    with spawn(command, tmp_path, env={"TMPDIR": str(temporary)}, name=end) as process:
        line = wait_until(
            lambda: next((x for x in process.stdout().splitlines() if x.startswith("shared")), None),
            timeout=60,
            what=lambda: f"the engine's arrival; stderr:\n{process.stderr()}",
        )
        _, value, path = line.split()
        assert value == "2.5"  # the engine process wrote and read the table
        if end != "exit":
            os.kill(process.popen.pid, getattr(signal, end))  # the program's first process only
        process.wait(30)
        left = sorted(p.name for p in temporary.iterdir() if p.name.startswith("inferwatch-arrivals-"))
        assert left == [], f"{end} left {left} (the table was {path})"
        assert path.startswith("/proc/")
