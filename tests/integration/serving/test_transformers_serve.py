"""``inferwatch run -- transformers serve``: a real OpenAI-compatible server, driven by the official client.

What a user of ``transformers serve`` sees is the HTTP request, so the server-side latencies must match what
its clients measure: time to first token and end-to-end latency are taken from the request's arrival
(queueing on the server's single inference thread included), token counts match the ``usage`` the server
reports, a client that hangs up is a ``cancelled`` request (not an ``error``), and a model that the server
unloads after ``--model-timeout`` leaves no memory and no ``llm_model_info`` series behind.

The server is ``transformers serve`` itself (FastAPI + uvicorn; one persistent ``InferenceThread`` per model
running ``model.generate`` with a ``DirectStreamer``), on a small random-weight model written locally
(:mod:`tests.support.servemodel`). Both ports are chosen explicitly: both programs default to 8000.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import http_get, parse_samples, sample_value
from tests.support.processes import INFERWATCH
from tests.support.servemodel import write_serve_model
from tests.support.services import wait_until
from tests.support.transformers_serve import (
    MAX_POSITIONS,
    Server,
    assert_close,
    concurrent_chats,
    delta,
    histogram_mean,
    metrics_after,
    serve,
    stream_chat,
    value,
)

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

#: Tokens per request of the timing tests: long enough that decode dominates, short on a loaded 2-core box.
MAX_TOKENS = 24
#: The long generation whose tokens/s is read while it runs, and the windows ``inferwatch top`` reads it in.
LONG_GENERATION_SECONDS = 60.0
TOP_WINDOW_SECONDS = 15.0


def check_latency_and_tokens(server: Server, clients: int) -> str:
    """Send ``clients`` concurrent streaming chats; the server's requests, tokens, TTFT and E2E must match
    what the clients measured and were told. Returns the exposition after the requests."""
    before = server.metrics()
    completions = concurrent_chats(server, clients, MAX_TOKENS)
    after = metrics_after(server, before, "llm_e2e_request_latency_seconds_count", clients)

    # The harness: every request streamed content and reported its usage.
    assert all(c.content_chunks > 0 and c.completion_tokens > 0 for c in completions), completions
    assert delta(before, after, "llm_requests_total", status="ok") == clients, server.logs()
    assert delta(before, after, "llm_time_to_first_token_seconds_count") == clients

    # Tokens, as the server's `usage` reports them. They agree with generate's by construction, for a
    # batch of one: `prompt_tokens` is `input_ids.shape[-1]` of the chat-templated prompt that generate
    # receives, and `completion_tokens` is DirectStreamer.total_tokens, one per token generate put() after
    # the prompt (an EOS included, as inferwatch counts a row up to and including its EOS).
    generated, prompted = (
        sum(c.completion_tokens for c in completions),
        sum(c.prompt_tokens for c in completions),
    )
    assert delta(before, after, "llm_generation_tokens_total") == generated
    assert delta(before, after, "llm_prompt_tokens_total") == prompted

    # Latency from the HTTP request's arrival: with 4 clients, 3 of them wait for the inference thread,
    # and their users see that wait in their time to first token.
    client_ttft = sum(c.time_to_first_chunk for c in completions) / clients
    client_total = sum(c.total for c in completions) / clients
    server_ttft = histogram_mean(before, after, "llm_time_to_first_token_seconds")
    server_e2e = histogram_mean(before, after, "llm_e2e_request_latency_seconds")
    print(
        f"\n{clients} client(s): TTFT server {server_ttft * 1000:.1f} ms"
        f" / clients {client_ttft * 1000:.1f} ms; E2E server {server_e2e * 1000:.1f} ms"
        f" / clients {client_total * 1000:.1f} ms"
    )
    assert_close("time to first token", server_ttft, client_ttft)
    assert_close("end-to-end latency", server_e2e, client_total)
    return after


@pytest.mark.parametrize("clients", [1, 4])
def test_latency_and_tokens_match_what_the_clients_see(server: Server, clients: int) -> None:
    check_latency_and_tokens(server, clients)


def test_continuous_batching_requests_match_what_the_clients_see(batching_server: Server) -> None:
    # Four clients at once: the manager schedules their prompts and decode tokens together. Each request
    # is measured as generate's are: from its HTTP arrival to the step that sampled its first token.
    after = check_latency_and_tokens(batching_server, 4)
    # The paged cache is read by the background sampler, at its next poll.
    wait_until(
        lambda: sample_value(batching_server.metrics(), "llm_kv_cache_blocks", state="total"),
        timeout=30,
        what=lambda: f"llm_kv_cache_blocks\n{batching_server.logs()}",
    )
    assert value(after, "llm_requests_running") == 0
    assert value(after, "llm_requests_waiting") == 0
    assert value(after, "llm_step_tokens_count", kind="decode") > 0
    assert value(after, "llm_step_tokens_count", kind="prefill") > 0


def top_tokens_per_second(server: Server) -> tuple[float, float]:
    """``inferwatch top --once --json``'s tok/s for the model, and when its window ended: its second
    scrape, made right before it prints and exits."""
    command = [*INFERWATCH, "top", "--once", "--json", "--window", str(TOP_WINDOW_SECONDS)]
    result = subprocess.run([*command, server.metrics_url], capture_output=True, text=True, timeout=60)
    ended = time.perf_counter()
    assert result.returncode == 0, result.stderr
    (model,) = json.loads(result.stdout)["models"]
    return model["tokens_per_second"], ended


def test_tokens_per_second_while_one_long_request_runs(server: Server) -> None:
    # A minute of tokens in one streaming request: `top` reads the live rate of the counter twice while it
    # runs, as a user watching a long generation does, and it must be what the client receives, not 0
    # until the request ends. At the end the counters equal the server's `usage`.
    client = server.client()
    start = server.metrics()
    probe = stream_chat(client, server.model, "how fast are you", max_tokens=64)
    rate = probe.content_chunks / (probe.total - probe.time_to_first_chunk)
    max_tokens = min(int(LONG_GENERATION_SECONDS * rate), MAX_POSITIONS - 200)
    # The probe's last tokens are settled when its generate returns, which can be after its client read the
    # end of the stream: the long request's counts start once the probe is counted.
    before = metrics_after(server, start, "llm_requests_total", 1)
    arrivals: list[float] = []
    outcome: dict[str, Any] = {}

    def generate() -> None:
        stream = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "a long story, please"}],
            max_tokens=max_tokens,
            stream=True,
            # As the OpenAI API specifies it: transformers serve 5.24 sent usage without it, 5.25 does not.
            stream_options={"include_usage": True},
        )
        usage = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.perf_counter())
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None, "no usage in the stream"
        outcome["usage"] = usage

    worker = threading.Thread(target=generate)
    worker.start()
    readings = []
    try:
        for share in (0.2, 0.55):  # two windows of the minute
            wait_until(lambda s=share: len(arrivals) >= s * max_tokens, 120, f"{share:.0%} of the tokens")
            readings.append(top_tokens_per_second(server))
    finally:
        worker.join(timeout=300)
    assert "usage" in outcome, server.logs()
    usage = outcome["usage"]
    # transformers serve 5.24 streamed one chunk a token; 5.25 decodes incrementally and sends a token
    # that completes no text with the next one: the client's tokens per chunk, from its usage.
    assert 0 < len(arrivals) <= usage.completion_tokens
    tokens_per_chunk = usage.completion_tokens / len(arrivals)
    for top_rate, end in readings:
        # The client's rate over top's window: the chunks received in the seconds before its second scrape.
        received = sum(1 for at in arrivals if end - TOP_WINDOW_SECONDS <= at < end)
        client_rate = received * tokens_per_chunk / TOP_WINDOW_SECONDS
        print(f"\ntop {top_rate:.1f} tok/s, client {client_rate:.1f} tok/s (request of {max_tokens} tokens)")
        assert abs(top_rate - client_rate) <= 0.10 * client_rate, (top_rate, client_rate, server.logs())
    after = metrics_after(server, before, "llm_requests_total", 1)
    assert delta(before, after, "llm_generation_tokens_total") == usage.completion_tokens
    assert delta(before, after, "llm_prompt_tokens_total") == usage.prompt_tokens


def test_concurrent_requests_queue_and_the_wait_is_measured(server: Server) -> None:
    # transformers serve runs one generate at a time per model: of 4 requests sent at once, 3 queue.
    before = server.metrics()
    concurrent_chats(server, 4, max_tokens=8)
    after = metrics_after(server, before, "llm_e2e_request_latency_seconds_count", 4)
    assert sample_value(after, "llm_requests_waiting") is not None, "llm_requests_waiting is not exposed"
    queued = delta(before, after, "llm_request_queue_seconds_sum")
    assert queued > 0, f"llm_request_queue_seconds_sum grew by {queued}\n{server.logs()}"


def process_tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with suppress(psutil.NoSuchProcess):  # a child that just exited
            total += process.memory_info().rss
    return total


def model_info_series(text: str) -> int:
    return sum(1 for s in parse_samples(text) if s.name == "llm_model_info")


@pytest.mark.timeout(90)
def test_a_model_unloaded_after_its_timeout_is_freed(tmp_path: Path) -> None:
    # No forced model: each request names the model directory, the server loads it, and unloads it 2 s
    # after the request arrived (TimedModel). Five cycles of load -> request -> unload must not grow the
    # process: an instrumentation that kept a strong reference to an unloaded model would keep every copy.
    # The MLPs make the model ~50 MB of weights, so a kept copy per cycle would show well beyond 10 % of
    # the server's RSS; they cost almost nothing per token.
    model_dir = write_serve_model(tmp_path / "model", hidden_size=128, intermediate_size=16384)
    cycles = 5
    with serve(tmp_path, model_dir, force_model=False, model_timeout=2, name="serve-timeout") as server:
        client = server.client()

        def loaded() -> bool:
            # /v1/models lists a model loaded from a local path only while it is in memory.
            status, body = http_get(f"http://127.0.0.1:{server.api_port}/v1/models", timeout=10)
            assert status == 200, body
            models = json.loads(body)["data"]
            return any(m["id"] == server.model and m["status"]["value"] == "loaded" for m in models)

        rss: list[int] = []
        series: list[int] = []
        for _ in range(cycles):
            completion = stream_chat(client, server.model, "hello", max_tokens=8)
            assert completion.completion_tokens > 0
            series.append(model_info_series(server.metrics()))
            wait_until(lambda: not loaded(), timeout=30, what=lambda: f"the model to unload\n{server.logs()}")
            time.sleep(0.5)  # the unload ran gc.collect(); let finalizers the instrumentation registered run
            series.append(model_info_series(server.metrics()))
            rss.append(process_tree_rss(server.process.popen.pid))

    mib = [round(r / 2**20, 1) for r in rss]
    print(f"\nRSS after each unload (MiB): {mib}; llm_model_info series: {series}")
    assert max(series) <= 1, f"llm_model_info series grew as models came and went: {series}"
    assert abs(rss[-1] - rss[0]) <= 0.10 * rss[0], f"RSS after each cycle (MiB): {mib}"
