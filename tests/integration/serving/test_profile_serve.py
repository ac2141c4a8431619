"""``inferwatch profile`` against ``inferwatch run -- transformers serve`` while the official ``openai``
client streams: a 20-step capture returns the top ops, the client's chunk gaps during the window and after
it are bounded (and back to the baseline after), a second capture at the same time is refused, the web
config's basic auth applies, and the trace stays within its bound on disk.

The server is started with profiling on (``INFERWATCH_PROFILE=1``), a web config with one user, and a
trace bound; it serves a small random-weight model (:mod:`tests.support.servemodel`) on the CPU.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support import free_port, parse_samples, sample_value, wait_for_http
from tests.support.certs import bcrypt_hash
from tests.support.processes import INFERWATCH, Process, spawn
from tests.support.servemodel import write_serve_model
from tests.support.services import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

TRANSFORMERS = str(Path(sys.executable).with_name("transformers"))
USER, PASSWORD = "ops", "profile-secret"
MAX_TRACE_BYTES = 64 * 2**20
MAX_FILES = 3
#: The window's chunk gaps: the median at most this many times the baseline's (a loaded 2-core machine;
#: the profiler records every operator of the serving thread), the worst at most this many seconds.
WINDOW_MEDIAN_FACTOR = 4.0
WINDOW_WORST_SECONDS = 3.0
#: After the window the median gap is back within this factor of the baseline.
AFTER_MEDIAN_FACTOR = 2.0
#: Chunk gaps compared just before and just after the capture.
NEIGHBOURS = 50


@dataclass
class Server:
    process: Process
    api_port: int
    metrics_port: int
    model: str
    profile_dir: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def logs(self) -> str:
        return f"server stderr (end):\n{self.process.stderr()[-6000:]}"


def authorization(password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()}


def post(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("profile-serve")
    model_dir = write_serve_model(workdir / "model", max_positions=8192)
    web = workdir / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD)}'\n")
    api_port, metrics_port = free_port(), free_port()
    command = [*INFERWATCH, "run", f"--port={metrics_port}", "--", TRANSFORMERS, "serve", str(model_dir)]
    command += [f"--port={api_port}", "--host=127.0.0.1", "--device=cpu", "--model-timeout=600"]
    env = {
        "INFERWATCH_PROFILE": "1",
        "INFERWATCH_PROFILE_DIR": str(workdir / "profiles"),
        "INFERWATCH_PROFILE_MAX_TRACE_BYTES": str(MAX_TRACE_BYTES),
        "INFERWATCH_PROFILE_MAX_FILES": str(MAX_FILES),
        "INFERWATCH_WEB_CONFIG_FILE": str(web),
    }
    with spawn(command, workdir, env=env, name="serve-profile") as process:
        running = Server(process, api_port, metrics_port, str(model_dir), workdir / "profiles")
        try:
            wait_for_http(f"http://127.0.0.1:{api_port}/health", timeout=180)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{running.logs()}") from None
        yield running


def stream(server: Server, max_tokens: int, arrivals: list[float]) -> None:
    client = OpenAI(
        base_url=f"http://127.0.0.1:{server.api_port}/v1", api_key="x", max_retries=0, timeout=300
    )
    chunks = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "a long story, please"}],
        max_tokens=max_tokens,
        stream=True,
    )
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())


def under_way(server: Server) -> bool:
    request = urllib.request.Request(f"{server.base}/debug/profile", headers=authorization())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())["state"] not in ("done", "failed")
    except urllib.error.HTTPError:
        return False  # 404: no capture yet


def gaps(arrivals: list[float], start: float, end: float) -> list[float]:
    inside = [t for t in arrivals if start <= t <= end]
    return [b - a for a, b in itertools.pairwise(inside)]


def test_unauthenticated_requests_are_refused(server: Server) -> None:
    assert post(f"{server.base}/debug/profile?steps=2", {}) == 401
    assert post(f"{server.base}/debug/profile?steps=2", authorization("wrong")) == 401


def serve_integration(server: Server) -> str:
    """The transformers serve integration the endpoint says it uses (its serve integration info series)."""
    request = urllib.request.Request(f"{server.base}/metrics", headers=authorization())
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = answer.read().decode()
    (found,) = {
        s.labels["integration"]
        for s in parse_samples(body)
        if s.name == "inferwatch_run_serve_integration_info"
    }
    return found


def engines(server: Server) -> float | None:
    request = urllib.request.Request(f"{server.base}/metrics", headers=authorization())
    with urllib.request.urlopen(request, timeout=10) as answer:
        return sample_value(answer.read().decode(), "inferwatch_run_processes", role="engine")


def test_a_capture_in_a_process_without_the_model_is_refused_at_once(server: Server) -> None:
    # transformers serve 5.25 runs the model in an engine process: the endpoint's process has none, and a
    # capture there would wait out its seconds for a forward that never comes. It says so at once.
    if serve_integration(server) != "engine":
        pytest.skip("the model runs in the endpoint's process (transformers serve before 5.25)")
    wait_until(lambda: engines(server) == 1, 30, "the engine process on the endpoint")
    request = urllib.request.Request(
        f"{server.base}/debug/profile?steps=2", headers=authorization(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 501
    message = json.loads(refused.value.read())["error"]
    assert "this process runs no model" in message and "engine process" in message, message


def test_a_capture_while_the_client_streams(server: Server, tmp_path: Path) -> None:
    if serve_integration(server) == "engine":
        pytest.skip(
            "transformers serve 5.25 runs the model in an engine process: profiles are not taken there"
        )
    # The first request loads nothing more (the model is forced) but warms the server's paths up.
    warm: list[float] = []
    stream(server, 8, warm)
    rate_probe: list[float] = []
    stream(server, 32, rate_probe)
    per_token = statistics.median(gaps(rate_probe, 0, float("inf")))
    # Long enough for a baseline, the window and an after-period of several seconds each.
    max_tokens = max(200, min(4000, int(30 / per_token)))
    arrivals: list[float] = []
    client = threading.Thread(target=stream, args=(server, max_tokens, arrivals))
    client.start()
    try:
        while len(arrivals) < max(20, max_tokens // 5):
            time.sleep(0.05)
        asked = time.perf_counter()
        command = [*INFERWATCH, "profile", server.base, "--steps", "20", "--seconds", "20", "--json"]
        command += ["--user", USER, "--out", str(tmp_path)]
        profile = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "INFERWATCH_PASSWORD": PASSWORD},
        )  # fmt: skip
        # Once the CLI's capture is under way, a second one is refused, not queued.
        wait_until(lambda: under_way(server), 60, "the capture of the CLI to start", interval=0.02)
        under_way_at = time.perf_counter()
        second = post(f"{server.base}/debug/profile?steps=2", authorization())
        out, err = profile.communicate(timeout=180)
        answered = time.perf_counter()
    finally:
        client.join(timeout=600)
    assert profile.returncode == 0, f"{err}\n{server.logs()}"
    assert second == 409
    summary = json.loads(out)
    capture = summary["capture"]
    assert capture["state"] == "done" and capture["steps_captured"] == 20, capture
    assert summary["top_by"] == "self CPU time" and summary["top"], summary
    assert any(row["name"].startswith("aten::") for row in summary["top"])
    assert summary["phases"]["decode"]["steps"] == 20
    # The trace is within its bound, on the server's disk and as fetched.
    trace = Path(summary["trace"])
    assert capture["trace_bytes"] <= MAX_TRACE_BYTES
    assert len(gzip.decompress(trace.read_bytes())) == capture["trace_bytes"]
    assert len(list(server.profile_dir.glob("inferwatch-profile-*"))) <= MAX_FILES

    # The client's chunk gaps: just before the capture was asked for, from when it was under way to the
    # CLI's answer, and just after (neighbouring chunks: each token of a long generation costs a little
    # more than the one before, and the machine's load drifts).
    baseline = gaps(arrivals, 0, asked)[-NEIGHBOURS:]
    during = gaps(arrivals, under_way_at, answered)
    after = gaps(arrivals, answered + 0.5, float("inf"))[:NEIGHBOURS]
    assert len(baseline) >= 10 and len(after) >= 10 and during, (len(baseline), len(during), len(after))
    base_median = statistics.median(baseline)
    print(
        f"\nchunk gaps (ms): baseline median {base_median * 1e3:.1f}; during the capture median "
        f"{statistics.median(during) * 1e3:.1f}, max {max(during) * 1e3:.1f}; after median "
        f"{statistics.median(after) * 1e3:.1f}; window {capture['window_seconds']:.2f} s, trace "
        f"{capture['trace_bytes']} bytes ({capture['trace_gzip_bytes']} gzipped), serving thread "
        f"{capture['serving_thread_seconds'] * 1e3:.1f} ms at step boundaries, CLI analysis "
        f"{summary['analysis_cpu_seconds']:.2f} s CPU"
    )
    assert statistics.median(during) <= WINDOW_MEDIAN_FACTOR * base_median
    assert max(during) <= WINDOW_WORST_SECONDS
    assert statistics.median(after) <= AFTER_MEDIAN_FACTOR * base_median
