"""``inferwatch demo``: a real process serving a stream of requests, scraped over HTTP, stopped cleanly."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.support import http_get, parse_samples, sample_value
from tests.support.processes import INFERWATCH, Process, spawn
from tests.support.services import wait_until

pytestmark = pytest.mark.integration

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
