"""``inferwatch run`` with a program of several processes: the models of every process on the one
endpoint, and a process that dies (SIGKILL) or exits leaves its counts and no stale gauges."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.support import documented_metrics, exposed_metrics, http_get, sample_value
from tests.support.processes import INFERWATCH, spawn
from tests.support.services import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

# A program as a user writes one with an engine process: the parent serves nothing itself; each child
# (started with multiprocessing's spawn, as transformers serve starts its engine) builds a model and runs
# `requests` generate calls of 6 new tokens, writes its pid, and then either waits to be killed or exits.
PROGRAM = """
import multiprocessing, sys, time
from pathlib import Path

def engine(name, requests, pid_file, linger):
    import os
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    model = LlamaForCausalLM(config)
    prompt = torch.tensor([[1, 2, 3]])
    for _ in range(requests):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, min_new_tokens=6,
                       do_sample=False)
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(linger)

if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    spawn = multiprocessing.get_context("spawn")
    killed = spawn.Process(target=engine, args=("killed", 2, workdir / "killed.pid", 120))
    killed.start()
    killed.join()
    exits = spawn.Process(target=engine, args=("exits", 1, workdir / "exits.pid", 0))
    exits.start()
    exits.join()
    deadline = time.monotonic() + 60
    while not (workdir / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def test_models_of_child_processes_are_served_and_a_killed_one_keeps_its_counts(
    tmp_path: Path, port: int
) -> None:
    program = tmp_path / "engines.py"
    program.write_text(PROGRAM, encoding="utf-8")
    url = f"http://127.0.0.1:{port}/metrics"
    command = [*INFERWATCH, "run", f"--port={port}", "--model-name=m", "--", sys.executable, str(program)]

    with spawn([*command, str(tmp_path)], tmp_path) as process:
        killed_pid = tmp_path / "killed.pid"
        body = wait_until(
            lambda: killed_pid.exists() and (b := _body(url)) and sample_value(b, "llm_requests_total") and b,
            timeout=120,
            what=lambda: f"the first engine's requests on {url}; stderr:\n{process.stderr()}",
        )
        assert sample_value(body, "llm_requests_total", model="m", status="ok") == 2
        assert sample_value(body, "llm_generation_tokens_total", model="m") == 12
        assert sample_value(body, "inferwatch_run_processes", role="engine") == 1
        assert sample_value(body, "llm_model_info") == 1

        os.kill(int(killed_pid.read_text()), signal.SIGKILL)
        body = wait_until(
            lambda: (b := _body(url)) and sample_value(b, "inferwatch_run_process_exits_total") and b,
            timeout=30,
            what="the killed engine's end on the endpoint",
        )
        assert sample_value(body, "inferwatch_run_process_exits_total", role="engine", how="died") == 1
        assert sample_value(body, "llm_requests_total", model="m", status="ok") == 2  # kept
        assert sample_value(body, "llm_generation_tokens_total", model="m") == 12
        assert sample_value(body, "llm_model_info") is None  # its gauges went with it
        assert sample_value(body, "llm_requests_running") is None
        assert "the engine process" in process.stderr() and "killed or crashed" in process.stderr()

        body = wait_until(
            lambda: (
                (b := _body(url))
                and sample_value(b, "inferwatch_run_process_exits_total", role="engine", how="exited")
                and b
            ),
            timeout=120,
            what=lambda: f"the second engine's goodbye; stderr:\n{process.stderr()}",
        )
        # The second engine said goodbye with its last collection: its request is counted though no
        # scrape came while it ran.
        assert sample_value(body, "llm_requests_total", model="m", status="ok") == 3
        assert sample_value(body, "llm_generation_tokens_total", model="m") == 18
        assert sample_value(body, "inferwatch_run_processes", role="engine") == 0
        # docs/metrics.md's section, both ways (the serve integration's info is transformers serve's).
        documented = documented_metrics("Launched program")
        exposed = {k: v for k, v in exposed_metrics(body).items() if k.startswith("inferwatch_run_")}
        assert exposed == {
            k: v for k, v in documented.items() if k != "inferwatch_run_serve_integration_info"
        }
        (tmp_path / "release").touch()
        assert process.wait(60) == 0


def _body(url: str) -> str | None:
    try:
        status, body = http_get(url, timeout=5)
    except OSError:
        return None
    return body if status == 200 else None
