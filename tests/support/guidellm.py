"""``guidellm`` (the vLLM project's load generator for OpenAI-compatible servers) run against a server of
:mod:`tests.support.transformers_serve`, and what it measured per request, read from its JSON report.

guidellm is a third-party client with its own dependency tree (an unpinned ``torch`` among them, and
``uvloop``/``websockets``, which uvicorn would pick up in the project's environment), so it lives in a
virtual environment of its own, ``.venv-guidellm/`` at the repository root, made with::

    python3 -m venv .venv-guidellm
    .venv-guidellm/bin/pip install torch==2.13.0 guidellm==0.8.1

(``torch==2.13.0`` first, pinned: unpinned, guidellm's ``torch`` resolves to a multi-GB CUDA build).
``INFERWATCH_GUIDELLM`` names another ``guidellm`` executable. A missing guidellm is an error, never a
skip (as a missing Prometheus is: :mod:`tests.support.services`).

How the tests drive it (guidellm 0.8, ``guidellm run``):

* synthetic prompts of ``prompt_tokens`` tokens of the model's own tokenizer, read from the model
  directory (``--tokenizer kind=hf_auto,model=DIR``, offline);
* the answer's length set by the backend's ``max_tokens`` (sent as ``max_completion_tokens``, and as
  ``max_tokens`` in the body for transformers 5.17, which reads only that), never by
  ``output_tokens`` in ``--data``: with that, guidellm also sends ``ignore_eos``, a field transformers
  serve refuses with 422;
* ``--profile kind=synchronous`` (one request at a time) or ``kind=concurrent,streams=N`` (N in flight),
  stopped after ``count`` requests (``--constraint kind=max_requests,count=N``).

What it reports per request (``benchmarks[].requests.{successful,errored,incomplete}``): its own
timestamps, taken as SSE lines arrive (``time_to_first_token_ms`` is the first line with content, the role
chunk excluded; ``request_latency`` runs to the end of the stream, usage chunk included;
``inter_token_latency_ms`` is ``(last token - first token) / (output_tokens - 1)``), and token counts
taken from the server's ``usage`` (its tokenizer only sizes the prompts).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import REPO_ROOT
from tests.support.transformers_serve import Server

#: The guidellm virtual environment the Makefile makes (see the module docstring).
GUIDELLM_VENV = REPO_ROOT / ".venv-guidellm"


def guidellm_executable() -> str:
    """``$INFERWATCH_GUIDELLM``, else ``.venv-guidellm/bin/guidellm``, else ``guidellm`` on PATH; raises
    (never skips) when none is there."""
    named = os.environ.get("INFERWATCH_GUIDELLM")
    if named:
        return named
    venv = GUIDELLM_VENV / "bin" / "guidellm"
    if venv.exists():
        return str(venv)
    found = shutil.which("guidellm")
    if found:
        return found
    raise AssertionError(
        f"guidellm is not installed: make it with `python3 -m venv {GUIDELLM_VENV} && "
        f"{GUIDELLM_VENV}/bin/pip install torch==2.13.0 guidellm==0.8.1`, or name one in INFERWATCH_GUIDELLM"
    )


@dataclass(frozen=True)
class GuidellmRequest:
    """One request as guidellm measured it (seconds) and as the server's ``usage`` counted it."""

    success: bool
    ttft: float | None  # request sent -> first SSE line with content
    itl: float | None  # mean gap between the request's tokens: (last - first) / (output_tokens - 1)
    e2e: float | None  # request sent -> end of the stream
    prompt_tokens: int
    output_tokens: int
    error: str | None = None


@dataclass(frozen=True)
class GuidellmReport:
    """Every request of one ``guidellm run``, and the means the tests compare with the server's."""

    requests: list[GuidellmRequest]
    log: str  # guidellm's console output, for failure messages
    #: Requests guidellm created (sent), from its scheduler's own count. guidellm 0.8.1 can leave the last
    #: one out of ``requests``: the update that completes it also sets its coordinator's shutdown event,
    #: before it is queued for the report, and a poll timing out in between ends the loop that reads the
    #: queue, which is then cleared (guidellm/scheduler/worker_group.py, ``request_updates``).
    sent: int

    @property
    def successful(self) -> list[GuidellmRequest]:
        return [r for r in self.requests if r.success]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.successful)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.successful)

    @property
    def mean_ttft(self) -> float:
        return _mean([r.ttft for r in self.successful])

    @property
    def mean_e2e(self) -> float:
        return _mean([r.e2e for r in self.successful])

    @property
    def mean_itl(self) -> float:
        """The mean gap between consecutive tokens over all the requests' gaps (each request's mean
        weighted by its ``output_tokens - 1`` gaps): what a histogram of one observation per gap, like the
        server's, averages to."""
        gaps = [(r.itl, r.output_tokens - 1) for r in self.successful if r.itl is not None]
        count = sum(n for _, n in gaps)
        assert count > 0, f"no inter-token gap in guidellm's report\n{self.log[-3000:]}"
        return sum(itl * n for itl, n in gaps) / count

    def summary(self) -> str:
        return (
            f"{len(self.successful)}/{len(self.requests)} ok, prompt {self.prompt_tokens} / output "
            f"{self.output_tokens} tokens, TTFT {self.mean_ttft * 1000:.1f} ms, E2E "
            f"{self.mean_e2e * 1000:.1f} ms, ITL {self.mean_itl * 1000:.3f} ms"
        )


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    assert present, "no value to average"
    return sum(present) / len(present)


def _seconds(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000


def _request(entry: dict[str, Any], success: bool) -> GuidellmRequest:
    return GuidellmRequest(
        success=success,
        ttft=_seconds(entry.get("time_to_first_token_ms")),
        itl=_seconds(entry.get("inter_token_latency_ms")),
        e2e=entry.get("request_latency"),
        prompt_tokens=entry.get("prompt_tokens") or 0,
        output_tokens=entry.get("output_tokens") or 0,
        error=(entry.get("info") or {}).get("error"),
    )


def parse_report(path: Path, log: str = "") -> GuidellmReport:
    """The requests of every benchmark in guidellm's JSON report (``--output kind=json,path=...``)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    requests: list[GuidellmRequest] = []
    sent = 0
    for benchmark in document["benchmarks"]:
        sent += benchmark["scheduler_state"]["created_requests"]
        listed = benchmark["requests"]
        found = [
            *(_request(e, True) for e in listed["successful"]),
            *(_request(e, False) for e in [*listed["errored"], *listed["incomplete"]]),
        ]
        # guidellm keeps a sample of the requests when asked to (--metrics sample_size): these runs need all.
        totals = benchmark["metrics"]["request_totals"]
        expected = totals["successful"] + totals["errored"] + totals["incomplete"]
        assert len(found) == expected, f"guidellm's report lists {len(found)} of its {expected} requests"
        requests += found
    return GuidellmReport(requests, log, sent)


def run_guidellm(
    server: Server,
    workdir: Path,
    *,
    requests: int,
    prompt_tokens: int,
    max_tokens: int,
    streams: int = 1,
    timeout: float = 300,
) -> GuidellmReport:
    """``requests`` streaming chat completions sent by guidellm to ``server``: one at a time
    (``streams=1``, its ``synchronous`` profile) or ``streams`` at once (``concurrent``). Each asks for
    ``max_tokens`` tokens after a synthetic prompt of ``prompt_tokens`` tokens (the chat template adds
    its own). Fails when guidellm fails; a request that failed is in the report, not raised."""
    workdir.mkdir(parents=True, exist_ok=True)
    report, log_path = workdir / "guidellm.json", workdir / "guidellm.log"
    target = f"http://127.0.0.1:{server.api_port}"
    profile = "kind=synchronous" if streams == 1 else f"kind=concurrent,streams={streams}"
    # guidellm sends max_tokens as max_completion_tokens, which transformers serve 5.17 ignores (it then
    # generated its default 1024): the body also carries the older field, which every version reads.
    backend = {
        "kind": "openai_http",
        "target": target,
        "model": server.model,
        "max_tokens": max_tokens,
        "extras": {"body": {"max_tokens": max_tokens}},
    }
    command = [
        guidellm_executable(),
        "run",
        f"--backend={json.dumps(backend)}",
        f"--profile={profile}",
        f"--constraint=kind=max_requests,count={requests}",
        f"--tokenizer=kind=hf_auto,model={server.model}",
        f"--data=kind=synthetic_text,prompt_tokens={prompt_tokens}",
        f"--output=kind=json,path={report}",
        "--disable-console-interactive",
    ]
    # Everything is local: the tokenizer is the model directory's; nothing may reach for a hub.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with log_path.open("wb") as log:
        result = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, timeout=timeout, check=False
        )
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert result.returncode == 0, f"guidellm exited {result.returncode}\n{output[-6000:]}"
    return parse_report(report, output)
