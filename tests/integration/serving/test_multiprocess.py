"""Multiprocess mode with real worker processes: the endpoint serves the sum of every worker, and a dead
worker's live gauges leave it; the oldest running request's age comes through as its worker wrote it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from inferwatch.instrumentation.endpoint.server import (
    MULTIPROC_DIR_ENV,
    mark_process_dead,
    multiprocess_registry,
    start_http_server,
)
from tests.support import free_port, http_get, sample_value
from tests.support.services import require_binary, wait_until

pytestmark = pytest.mark.integration


# One worker process of a multi-worker server: instrument tiny-llama, serve requests of known lengths.
WORKER = """
import sys, torch
from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model

model = build_model("tiny-llama")
handle = instrument(model, model_name="pooled")
prompt = torch.tensor([[256, 104, 105, 33, 32, 33]])
for new_tokens in map(int, sys.argv[1:]):
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False)
assert handle.flush(10)
"""


def test_multiprocess_mode_sums_two_worker_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    multiproc_dir = tmp_path / "multiproc"
    multiproc_dir.mkdir()
    env = {**os.environ, MULTIPROC_DIR_ENV: str(multiproc_dir)}
    requests_of = {"a": ["6"], "b": ["4", "4"]}
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, *lengths], env=env, cwd=tmp_path)
        for lengths in requests_of.values()
    ]
    try:
        assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()

    # The serving endpoint of the pool: with the variable set, the default registry is the aggregate.
    monkeypatch.setenv(MULTIPROC_DIR_ENV, str(multiproc_dir))
    with start_http_server(0) as server:
        body = http_get(server.url)[1]
        assert sample_value(body, "llm_requests_total", model="pooled", status="ok") == 3
        assert sample_value(body, "llm_generation_tokens_total", model="pooled") == 6 + 4 + 4
        assert sample_value(body, "llm_prompt_tokens_total", model="pooled") == 3 * 6
        assert sample_value(body, "llm_time_to_first_token_seconds_count", model="pooled") == 3
        assert sample_value(body, "llm_inter_token_latency_seconds_count", model="pooled") == 5 + 3 + 3
        assert sample_value(body, "llm_requests_running", model="pooled") == 0

        # What a server's worker-exit hook does: the dead workers' live gauges leave the sums, their
        # counters and histograms stay.
        for worker in workers:
            mark_process_dead(worker.pid)
        body = http_get(server.url)[1]
        assert sample_value(body, "llm_requests_running", model="pooled") is None
        assert sample_value(body, "llm_generation_tokens_total", model="pooled") == 14


# A worker holding one tracked request that arrived 30 s before it started, until the test says so.
HELD_WORKER = """
import sys, time
from inferwatch.instrumentation import track_request

with track_request(model_name="held", arrival=time.perf_counter() - 30.0) as req:
    req.token()
    print("running", flush=True)
    sys.stdin.readline()
print("done", flush=True)
"""


def test_multiprocess_mode_has_the_oldest_running_requests_age(tmp_path: Path) -> None:
    """No scrape reaches a worker: it writes the age itself (here when its request starts and at its
    token's heartbeat), and the endpoint shows it as written, not younger than at that moment."""
    multiproc_dir = tmp_path / "multiproc"
    multiproc_dir.mkdir()
    env = {**os.environ, MULTIPROC_DIR_ENV: str(multiproc_dir)}
    spawned = time.perf_counter()
    worker = subprocess.Popen(
        [sys.executable, "-c", HELD_WORKER],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout.readline() == "running\n"
        aggregate = multiprocess_registry(multiproc_dir)
        age = aggregate.get_sample_value("llm_request_oldest_running_age_seconds", {"model": "held"})
        assert 30.0 <= age <= 30.0 + (time.perf_counter() - spawned)
        assert aggregate.get_sample_value("llm_requests_running", {"model": "held"}) == 1
        worker.stdin.write("\n")
        worker.stdin.flush()
        assert worker.stdout.readline() == "done\n"
        assert aggregate.get_sample_value("llm_request_oldest_running_age_seconds", {"model": "held"}) == 0
        assert aggregate.get_sample_value("llm_requests_running", {"model": "held"}) == 0
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        worker.wait()
    mark_process_dead(worker.pid, multiproc_dir)
    aggregate = multiprocess_registry(multiproc_dir)
    assert aggregate.get_sample_value("llm_request_oldest_running_age_seconds", {"model": "held"}) is None


# A pre-forking server in miniature (gunicorn's shape): the master, where `inferwatch run` started the
# endpoint, forks workers that each hold one running request, and reaps them as they die.
PREFORK = """
import os, time
from inferwatch.instrumentation import track_request

for _ in range(3):
    if os.fork() == 0:
        with track_request(model_name="forked"):
            os.write(1, f"{os.getpid()}\\n".encode())  # one write: atomic on a pipe, beside the others
            time.sleep(600)
        os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(600)
"""


@pytest.mark.timing
def test_a_killed_workers_gauges_go_and_a_killed_masters_port_is_free_at_once(tmp_path: Path) -> None:
    multiproc_dir = tmp_path / "multiproc"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    launcher = [require_binary("inferwatch"), "run", "--multiprocess-dir", str(multiproc_dir)]
    master = subprocess.Popen(
        [*launcher, "--port", str(port), "--", sys.executable, "-c", PREFORK],
        stdout=subprocess.PIPE,
        text=True,
    )
    workers = []
    try:
        workers = [int(master.stdout.readline()) for _ in range(3)]  # type: ignore[union-attr]

        def running() -> float | None:
            return sample_value(http_get(url)[1], "llm_requests_running", model="forked")

        wait_until(lambda: running() == 3, 30, "3 running requests")
        # Killed mid-request, without any hook: its running request leaves the sum.
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: running() == 2, 10, lambda: f"2 running requests (now {running()})")

        # The master dies; its workers live on (until they notice), but hold no copy of the port.
        master.kill()
        master.wait(10)
        killed = time.monotonic()

        def port_free() -> bool:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    return False
                return True

        wait_until(port_free, 10, "the port to be free")
        assert time.monotonic() - killed < 2.0
        assert all(psutil.pid_exists(pid) for pid in workers[1:])  # alive, yet not holding the port
    finally:
        master.kill()
        master.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
