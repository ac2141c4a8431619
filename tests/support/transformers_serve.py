"""``inferwatch run -- transformers serve``: a real OpenAI-compatible server under the launcher, its
official client, and what the tests read from both.

The server is ``transformers serve`` itself (FastAPI + uvicorn; one persistent ``InferenceThread`` per model
running ``model.generate`` with a ``DirectStreamer``, or a continuous-batching manager), on a small
random-weight model written locally (:mod:`tests.support.servemodel`). Both ports are chosen explicitly:
both programs default to 8000.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from tests.support import free_port, http_get, sample_value, wait_for_http
from tests.support.clienttiming import without_gc_pauses
from tests.support.processes import INFERWATCH, Process, spawn
from tests.support.services import wait_until

#: The ``transformers`` command of this interpreter's environment (its ``serving`` extra installed).
TRANSFORMERS = str(Path(sys.executable).with_name("transformers"))

# Timing comparisons: the server's mean within 10 % of the clients' mean, or within 50 ms of it (what the
# client adds — connecting, sending the body, SSE framing, the final usage chunk — is a few ms a request).
RELATIVE_TOLERANCE = 0.10
ABSOLUTE_TOLERANCE = 0.05

#: Positions of the model the module's server serves: room for a minute of tokens on a fast machine.
MAX_POSITIONS = 32768


@functools.cache
def serve_has_option(option: str) -> bool:
    """Whether the installed ``transformers serve`` has ``option``, read from its ``--help`` (a feature,
    not a version number)."""
    result = subprocess.run(
        [TRANSFORMERS, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return option in result.stdout


@dataclass
class Server:
    """A ``transformers serve`` process under ``inferwatch run``."""

    process: Process
    api_port: int
    metrics_port: int
    model: str  # the model directory: the ``model`` field of every request

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def client(self) -> OpenAI:
        # No retries: a failed request must fail the test, not be sent again and counted twice.
        client = OpenAI(
            base_url=f"http://127.0.0.1:{self.api_port}/v1", api_key="x", max_retries=0, timeout=120
        )
        # The client imports its chat resources at their first use. Inside the first timed request that
        # import was 20 ms of the client's TTFT here and 228 ms on a CI machine: time of the client's
        # process that the server never sees. Taken here, untimed, as a long-running client has it.
        _ = client.chat.completions
        return client

    def metrics(self) -> str:
        status, body = http_get(self.metrics_url, timeout=10)
        assert status == 200, f"{self.metrics_url} answered {status}"
        return body

    def logs(self) -> str:
        """The end of the server's stderr, for failure messages (where the instrumentation logs errors)."""
        return f"server stderr (end):\n{self.process.stderr()[-6000:]}"


@contextmanager
def serve(
    workdir: Path,
    model_dir: Path,
    *,
    force_model: bool,
    model_timeout: int,
    name: str,
    options: tuple[str, ...] = (),
) -> Iterator[Server]:
    """Start ``inferwatch run --port P -- transformers serve [DIR] --port Q [OPTIONS]`` and wait until both
    answer.

    The process runs in its own session; leaving the block kills its process group (``spawn``).
    """
    api_port, metrics_port = free_port(), free_port()
    while metrics_port == api_port:
        metrics_port = free_port()
    command = [*INFERWATCH, "run", f"--port={metrics_port}", "--", TRANSFORMERS, "serve"]
    if force_model:
        command.append(str(model_dir))
    command += [
        f"--port={api_port}",
        "--host=127.0.0.1",
        "--device=cpu",
        f"--model-timeout={model_timeout}",
        *options,
    ]
    # An empty hub cache of its own: the server reads no model from the machine's, and transformers serve
    # 5.17 answers /v1/models with a 500 where the cache directory does not exist (a fresh machine).
    cache = workdir / "hf-cache"
    cache.mkdir(exist_ok=True)
    with spawn(command, workdir, name=name, env={"HF_HUB_CACHE": str(cache)}) as process:
        server = Server(process, api_port, metrics_port, str(model_dir))
        try:
            # Start-up imports torch, transformers and FastAPI, and loads a forced model: slow on busy cores.
            wait_for_http(f"http://127.0.0.1:{api_port}/health", timeout=180)
            wait_for_http(server.metrics_url, timeout=30)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{server.logs()}") from None
        yield server


@dataclass(frozen=True)
class Completion:
    """What one streaming client measured and was told."""

    time_to_first_chunk: float  # request sent -> first chunk with content
    total: float  # request sent -> stream exhausted (usage chunk included)
    content_chunks: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    content: str = ""


def stream_chat(client: OpenAI, model: str, prompt: str, max_tokens: int, **options: object) -> Completion:
    """One streaming chat completion, timed as a user of the API times it."""
    with without_gc_pauses():  # what this process's collector stops is not the server's time
        start = time.perf_counter()
        first: float | None = None
        chunks = 0
        usage = None
        reason = None
        content = ""
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            # transformers serve logs `stream_options` as unsupported and ignores it, but sends usage with the
            # final chunk anyway; asked for all the same, as a client of any OpenAI-compatible server would.
            stream_options={"include_usage": True},
            **options,
        )
        for chunk in stream:
            # The first chunk carries only the role, sent before generation starts: not a token.
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                content += chunk.choices[0].delta.content
                if first is None:
                    first = time.perf_counter() - start
            if chunk.choices:
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage is not None:
                usage = chunk.usage
        total = time.perf_counter() - start
    assert first is not None, "no content chunk"
    assert usage is not None, "no usage in the stream"
    return Completion(first, total, chunks, usage.prompt_tokens, usage.completion_tokens, reason, content)


def concurrent_chats(server: Server, clients: int, max_tokens: int) -> list[Completion]:
    """``clients`` streaming requests sent at once (a barrier lines the threads up), one prompt each."""
    barrier = threading.Barrier(clients)
    client = server.client()

    def one(index: int) -> Completion:
        barrier.wait(timeout=30)
        return stream_chat(client, server.model, f"request {index}: tell me about the weather", max_tokens)

    with ThreadPoolExecutor(max_workers=clients) as pool:
        return list(pool.map(one, range(clients)))


def value(text: str, name: str, **labels: str) -> float:
    """A sample's value, 0 when it is not exposed yet (the model is instrumented at its first generate)."""
    return sample_value(text, name, **labels) or 0.0


def delta(before: str, after: str, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def metrics_after(server: Server, before: str, name: str, increase: float, timeout: float = 60) -> str:
    """The exposition once ``name`` grew by ``increase`` since ``before`` (some observations are made in
    the background after the response ended)."""

    def probe() -> str | None:
        body = server.metrics()
        return body if delta(before, body, name) >= increase else None

    try:
        return wait_until(probe, timeout=timeout, what=f"{name} to grow by {increase}")
    except Exception as exc:
        raise AssertionError(f"{exc}; now {value(server.metrics(), name)}\n{server.logs()}") from None


def assert_close(
    what: str, server_mean: float, client_mean: float, absolute: float = ABSOLUTE_TOLERANCE
) -> None:
    tolerance = max(RELATIVE_TOLERANCE * client_mean, absolute)
    assert abs(server_mean - client_mean) <= tolerance, (
        f"{what}: server mean {server_mean * 1000:.1f} ms, clients' mean {client_mean * 1000:.1f} ms "
        f"(tolerance {tolerance * 1000:.1f} ms)"
    )


def histogram_mean(before: str, after: str, name: str) -> float:
    """Mean of the observations of histogram ``name`` made between the two scrapes."""
    count = delta(before, after, f"{name}_count")
    assert count > 0, f"no {name} observation"
    return delta(before, after, f"{name}_sum") / count
