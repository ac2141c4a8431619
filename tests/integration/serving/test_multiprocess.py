"""Multiprocess mode with real worker processes: the endpoint serves the sum of every worker, and a dead
worker's live gauges leave it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from inferwatch.instrumentation.exposition import MULTIPROC_DIR_ENV, mark_process_dead, start_http_server

from tests.support import http_get, sample_value

pytestmark = pytest.mark.integration


# One worker process of a multi-worker server: instrument tiny-llama, serve requests of known lengths.
WORKER = """
import sys, torch
from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.models import build_model

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
