"""``inferwatch profile URL``: profile the next forward steps of a running serving process.

It asks the process's metrics endpoint (``POST /debug/profile``, :mod:`inferwatch.instrumentation.
profiling_http`) for a capture, waits for it, downloads the compressed Chrome trace (which Perfetto and
chrome://tracing open) into ``--out``, and summarizes it here (:mod:`.profile_summary`): the analysis
costs this process, never the server. No torch.

Exit status: 0 with a summary, 1 when the capture failed or was refused (the reason on stderr), 2 for
bad options, 3 when the endpoint could not be reached.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checklist import MEMORY
from .checks.findings import Evidence, Finding, Severity
from .errors import ConfigError
from .http import FetchError, Response, fetch
from .profile_summary import VERDICT_ITEMS, Summary, load_trace, render_text, summarize
from .scrape import normalize_url

EXIT_FAILED = 1
EXIT_UNREACHABLE = 3
PASSWORD_ENV = "INFERWATCH_PASSWORD"
#: How long past the capture's own bound to wait for its trace to be written.
WRITE_GRACE_SECONDS = 60.0
POLL_SECONDS = 0.25

USAGE_ERRORS = (ConfigError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the serving process's metrics endpoint (http://HOST:PORT[/metrics])")
    parser.add_argument("--steps", type=int, default=20, help="forward steps to capture (default 20)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="the longest the capture may take (default 10)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("."), metavar="DIR", help="where the trace is saved (default .)"
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also record the CUDA allocator's history over the window and save its snapshot "
        "(https://pytorch.org/memory_viz opens it)",
    )
    parser.add_argument(
        "--arm-oom",
        type=float,
        metavar="SECONDS",
        help="instead of a capture: arm the process for the next OOM for this long (CUDA), and print "
        "its OOM evidence state",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each answer")
    parser.add_argument("--user", help=f"basic-auth user; the password is read from ${PASSWORD_ENV}")
    parser.add_argument("--ca-file", type=Path, help="CA certificate(s) that sign an https endpoint's")


def _base(url: str) -> str:
    """The endpoint's base URL (``HOST:PORT``, a base URL or a metrics URL accepted); ConfigError for
    anything that is not an http(s) URL."""
    return normalize_url(url).removesuffix("/metrics")


def auth_headers(user: str | None) -> dict[str, str]:
    """Basic auth for ``user`` with the password of ``$INFERWATCH_PASSWORD``; none without a user."""
    if not user:
        return {}
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        raise ConfigError(f"--user needs the password in ${PASSWORD_ENV}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def tls_context(ca_file: Path | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--ca-file {ca_file}: {exc}") from None


def _document(answer: Response) -> dict[str, Any]:
    try:
        return json.loads(answer.body)
    except json.JSONDecodeError:
        return {"error": f"HTTP {answer.status}: {answer.text.strip()[:200]}"}


class ProfileError(Exception):
    """A capture was refused or failed (:data:`EXIT_FAILED`), or the endpoint could not be reached
    (:data:`EXIT_UNREACHABLE`); the message says why."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Profiled:
    """A finished capture: the server's state of it, where its files were saved, and its summary."""

    state: dict[str, Any]
    trace: Path
    memory: Path | None
    summary: Summary
    analysis_cpu_seconds: float


@dataclass
class ProfileClient:
    """The ``/debug/`` routes of one serving process's endpoint."""

    url: str
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    context: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        self.base = _base(self.url)

    def call(self, path: str, method: str = "GET", **params: str) -> Response:
        try:
            return fetch(
                f"{self.base}{path}",
                self.timeout,
                params=params,
                method=method,
                headers=self.headers,
                context=self.context,
            )
        except FetchError as exc:
            raise ProfileError(f"{self.base}: {exc}", EXIT_UNREACHABLE) from None

    def capture(self, steps: int, seconds: float, out: Path, memory: bool = False) -> Profiled:
        """Take a capture, wait for it, save its files into ``out`` and summarize its trace."""
        params = {"steps": str(steps), "seconds": f"{seconds:g}", "memory": "1" if memory else "0"}
        answer = self.call("/debug/profile", "POST", **params)
        state = _document(answer)
        if answer.status != 202:
            raise ProfileError(f"refused ({answer.status}): {state.get('error')}")
        # The capture waits up to `seconds` for a first step, then runs up to `seconds`.
        deadline = time.monotonic() + 2 * seconds + WRITE_GRACE_SECONDS
        while state.get("state") not in ("done", "failed"):
            if time.monotonic() > deadline:
                raise ProfileError(
                    f"capture {state.get('id')} still {state.get('state')}: the serving thread has not come "
                    "back to a step boundary"
                )
            time.sleep(POLL_SECONDS)
            state = _document(self.call("/debug/profile", id=state["id"]))
        if state["state"] == "failed":
            raise ProfileError(f"capture {state['id']} failed: {state['error']}")
        out.mkdir(parents=True, exist_ok=True)
        trace = out / Path(state["trace_file"]).name  # the server's name, stripped of any directory
        trace.write_bytes(self._file("/debug/profile/trace", state["id"]))
        snapshot = None
        if state.get("memory_file"):
            snapshot = out / Path(state["memory_file"]).name
            snapshot.write_bytes(self._file("/debug/profile/memory", state["id"]))
        started = time.process_time()
        summary = summarize(load_trace(trace))
        return Profiled(state, trace, snapshot, summary, time.process_time() - started)

    def _file(self, path: str, capture_id: str) -> bytes:
        answer = self.call(path, id=capture_id)
        if answer.status != 200:
            raise ProfileError(f"no file at {path}: {_document(answer).get('error')}")
        return answer.body

    def oom_state(self) -> dict[str, Any] | None:
        """``GET /debug/oom``: OOMs caught while armed and their files; None where profiling is off."""
        answer = self.call("/debug/oom")
        return _document(answer) if answer.status == 200 else None

    def arm_oom(self, seconds: float) -> dict[str, Any]:
        answer = self.call("/debug/oom", "POST", seconds=f"{seconds:g}")
        state = _document(answer)
        if answer.status != 202:
            raise ProfileError(f"refused ({answer.status}): {state.get('error')}")
        return state


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.seconds <= 0:
        raise ConfigError("--steps must be at least 1 and --seconds positive")
    client = ProfileClient(args.url, args.timeout, auth_headers(args.user), tls_context(args.ca_file))
    try:
        if args.arm_oom is not None:
            print(json.dumps(client.arm_oom(args.arm_oom), indent=2))
            return 0
        profiled = client.capture(args.steps, args.seconds, args.out, args.memory)
    except ProfileError as exc:
        print(f"inferwatch profile: {exc}", file=sys.stderr)
        return exc.status
    state = profiled.state
    if args.json:
        document = {
            "capture": state,
            "trace": str(profiled.trace),
            "memory_snapshot": None if profiled.memory is None else str(profiled.memory),
            "analysis_cpu_seconds": profiled.analysis_cpu_seconds,
            **profiled.summary.to_dict(),
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        heading = (
            f"inferwatch profile: {client.base}, capture {state['id']}: {state['steps_captured']} steps "
            f"(stopped by {state['stopped_by']}), trace {profiled.trace} ({state['trace_bytes']} bytes, "
            f"{state['trace_gzip_bytes']} compressed)"
        )
        if profiled.memory is not None:
            heading += f"; memory snapshot {profiled.memory}"
        print(render_text(profiled.summary, heading))
    return 0


def profile_findings(profiled: Profiled, url: str) -> list[Finding]:
    """``inferwatch diagnose --profile``'s finding: the capture's verdict with its evidence (none for a
    trace without a verdict: a model on the CPU)."""
    summary, doc = profiled.summary, profiled.summary.to_dict()
    if summary.verdict is None:
        return []
    source = f"inferwatch profile {url} (trace {profiled.trace})"
    evidence = [Evidence("device busy over the window", f"{doc['device_busy_ratio']:.1%}", source)]
    idle = doc["idle"]
    window = doc["window_seconds"] or 1.0
    split = ", ".join(
        f"{what} {idle[f'{kind}_seconds'] / window:.1%}"
        for kind, what in (
            ("host_wait", "host wait"),
            ("kernel_gaps", "gaps between kernels"),
            ("sync_wait", "syncs"),
        )
    )
    evidence.append(Evidence("device idle, as shares of the window", split, source))
    if doc["top"]:
        top = doc["top"][0]
        evidence.append(
            Evidence(f"top kernel by device time: {top['name'][:80]}", f"{top['share']:.1%}", source)
        )
    for phase, totals in doc["phases"].items():
        if totals["steps"]:
            value = f"{totals['steps']} steps, median {totals['median_step_seconds'] * 1e3:.2f} ms"
            evidence.append(Evidence(f"{phase} steps", value, source))
    severity = Severity.WARNING if summary.verdict in ("host-bound", "launch-bound") else Severity.INFO
    return [
        Finding(
            summary.verdict,
            severity,
            f"profile of {_base(url)}",
            f"a {profiled.state['steps_captured']}-step profile: {summary.why}",
            tuple(evidence),
            VERDICT_ITEMS[summary.verdict],
        )
    ]


def with_oom_evidence(findings: list[Finding], oom: dict[str, Any] | None, url: str) -> list[Finding]:
    """The findings with the evidence files of the OOMs the process caught while armed: attached to the
    out-of-memory findings, or as a finding of their own where the metrics showed none."""
    if not oom or not oom.get("files"):
        return findings
    latest = oom["files"][-1]
    where = f"{_base(url)}/debug/oom/file?n=-1&kind=snapshot (and kind=summary)"
    extra = Evidence(
        f"allocator summary and snapshot of the latest of {oom['ooms']} OOM(s) caught while armed",
        f"{latest['summary']}, {latest['snapshot']}",
        where,
    )
    out, attached = [], False
    for finding in findings:
        if finding.check == "oom-risk" and finding.summary.startswith("out-of-memory"):
            finding = dataclasses.replace(finding, evidence=(*finding.evidence, extra))
            attached = True
        out.append(finding)
    if not attached:
        summary = "the process ran out of device memory while armed for an OOM"
        out.append(
            Finding("oom-risk", Severity.CRITICAL, f"process {_base(url)}", summary, (extra,), (MEMORY,))
        )
    return out
