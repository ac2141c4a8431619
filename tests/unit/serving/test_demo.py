"""``inferwatch demo``: a real process serving a stream of requests, scraped over HTTP, stopped cleanly."""

from __future__ import annotations

import math
import re
import signal
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from inferwatch.cli import main as inferwatch
from inferwatch.instrumentation.demo import RequestStream, histogram_quantile

from tests.integration.services import wait_until
from tests.support import http_get, parse_samples, sample_value
from tests.unit.serving.processes import INFERWATCH, Process, spawn

SUMMARY_LINE = re.compile(
    r"^\[\s*\d+ s\] TTFT p50 [\d.]+ ms, p95 [\d.]+ ms \| +[\d.]+ tokens/s "
    r"\| KV cache [\d.]+ MiB \| \d+ requests$",
    re.MULTILINE,
)


def demo_command(port: int, *options: str) -> list[str]:
    return [
        *INFERWATCH,
        "demo",
        "--model=tiny-llama",
        f"--port={port}",
        "--max-new-tokens=8",
        "--prompt-len-range",
        "4",
        "24",
        *options,
    ]


def scrape_when(process: Process, url: str, name: str, at_least: float, **labels: str) -> str:
    """The exposition once ``name`` reached ``at_least`` (the demo must still be running)."""

    def probe() -> str | None:
        assert process.popen.poll() is None, f"demo exited early:\n{process.stdout()}\n{process.stderr()}"
        try:
            status, body = http_get(url, timeout=2)
        except OSError:
            return None
        value = sample_value(body, name, **labels) if status == 200 else None
        return body if value is not None and value >= at_least else None

    return wait_until(probe, timeout=120, what=lambda: f"{name} >= {at_least} on {url}:\n{process.stderr()}")


def stopped_after(stdout: str) -> int:
    match = re.search(r"stopped after (\d+) requests", stdout)
    assert match, stdout
    return int(match[1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_serves_varied_requests_then_stops_after_duration(tmp_path: Path, port: int, device: str) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    options = ("--duration=6", "--summary-interval=1", "--concurrency=2", f"--device={device}")
    command = demo_command(port, *options)
    with spawn(command, tmp_path) as process:
        body = scrape_when(process, url, "llm_requests_total", 20, model="tiny-llama", status="ok")
        # Some requests carry several sequences; every request's tokens are counted.
        assert sample_value(body, "llm_batch_size_sum") > sample_value(body, "llm_batch_size_count")
        assert sample_value(body, "llm_generation_tokens_total", model="tiny-llama") >= 20
        devices = {s.labels["device"] for s in parse_samples(body) if s.name == "llm_model_info"}
        assert devices == {"cpu" if device == "cpu" else "cuda:0"}
        assert process.wait(60) == 0
    stdout = process.stdout()
    assert f"metrics on {url}" in stdout
    assert len(SUMMARY_LINE.findall(stdout)) >= 2, stdout
    assert stopped_after(stdout) >= 20
    with pytest.raises(OSError):  # the endpoint went away with the demo
        http_get(url, timeout=2)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_step_sleep_and_a_clean_stop_on_signal(tmp_path: Path, port: int, stop_signal: int) -> None:
    # A 50 ms host-side sleep in every decode step: no token of any request comes faster than 50 ms / 4
    # (the largest batch), whereas tiny-llama's own decode step takes a few milliseconds.
    url = f"http://127.0.0.1:{port}/metrics"
    with spawn(demo_command(port, "--step-sleep=0.05"), tmp_path) as process:
        body = scrape_when(process, url, "llm_requests_total", 2, model="tiny-llama", status="ok")
        assert sample_value(body, "llm_inter_token_latency_seconds_count") > 0
        assert sample_value(body, "llm_inter_token_latency_seconds_bucket", le="0.01") == 0
        process.popen.send_signal(stop_signal)
        assert process.wait(30) == 0
    assert stopped_after(process.stdout()) >= 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model=gpt-5"], "--model: unknown model 'gpt-5'"),
        (["--port=-1"], "--port: port must be an integer in 0..65535, got -1"),
        (["--prompt-len-range", "9", "3"], "--prompt-len-range: need 1 <= MIN <= MAX, got 9 3"),
        (["--max-new-tokens=0"], "--max-new-tokens: must be >= 1, got 0"),
        (["--concurrency=0"], "--concurrency: must be >= 1, got 0"),
        (["--duration=0"], "--duration: must be a finite number > 0, got 0.0"),
        (["--step-sleep=-1"], "--step-sleep: must be a finite number >= 0, got -1.0"),
    ],
)
def test_bad_arguments_exit_2(arguments: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert inferwatch(["demo", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_bad_instrumentation_variable_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("INFERWATCH_TTFT_BUCKETS", "0.5,0.1")
    assert inferwatch(["demo", "--model=tiny-llama"]) == 2
    assert "INFERWATCH_TTFT_BUCKETS='0.5,0.1'" in capsys.readouterr().err


def test_unknown_option_exits_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        inferwatch(["demo", "--device=tpu"])
    assert exit_.value.code == 2
    assert "--device: invalid choice: 'tpu'" in capsys.readouterr().err


def test_taken_port_exits_2(port: int, capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert inferwatch(["demo", "--model=tiny-llama", f"--port={port}"]) == 2
    assert (
        f"cannot serve metrics on 127.0.0.1:{port}: the address is already in use" in capsys.readouterr().err
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert inferwatch(["demo", "--model=tiny-llama", "--device=cuda"]) == 2
    assert "--device cuda: no usable CUDA device" in capsys.readouterr().err


def test_request_stream_mixes_shapes_and_decoding_and_is_reproducible() -> None:
    def draws(seed: int) -> Sequence:
        stream = RequestStream(seed, (4, 24), 16)
        return [stream.next() for _ in range(400)]

    requests = [request for request, _ in draws(3)]
    assert draws(3) == draws(3) != draws(4)
    assert {r.batch_size for r in requests} == {1, 2, 3, 4}
    assert {r.do_sample for r in requests} == {True, False}
    assert {r.prompt_len for r in requests} == set(range(4, 25))
    assert {r.max_new_tokens for r in requests} == set(range(4, 17))


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 2.0), (0.2, 6.0), (math.inf, 8.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 4: halfway through (0.1, 0.2]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)  # rank 2: the top of the first bucket
    assert histogram_quantile(0.95, buckets) == 0.2  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
