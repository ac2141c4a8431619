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
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .http import FetchError, Response, fetch
from .profile_summary import load_trace, render_text, summarize

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
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/").removesuffix("/metrics")


def _headers(args: argparse.Namespace) -> dict[str, str]:
    if not args.user:
        return {}
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        raise ConfigError(f"--user needs the password in ${PASSWORD_ENV}")
    token = base64.b64encode(f"{args.user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(args.ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--ca-file {args.ca_file}: {exc}") from None


def _document(answer: Response) -> dict[str, Any]:
    try:
        return json.loads(answer.body)
    except json.JSONDecodeError:
        return {"error": f"HTTP {answer.status}: {answer.text.strip()[:200]}"}


def _arm_oom(args: argparse.Namespace, call: Any) -> int:
    try:
        answer = call("/debug/oom", "POST", seconds=f"{args.arm_oom:g}")
    except FetchError as exc:
        print(f"inferwatch profile: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    state = _document(answer)
    if answer.status != 202:
        print(f"inferwatch profile: refused ({answer.status}): {state.get('error')}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(state, indent=2))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.seconds <= 0:
        raise ConfigError("--steps must be at least 1 and --seconds positive")
    base, headers, context = _base(args.url), _headers(args), _context(args)

    def call(path: str, method: str = "GET", **params: str) -> Response:
        return fetch(
            f"{base}{path}", args.timeout, params=params, method=method, headers=headers, context=context
        )

    if args.arm_oom is not None:
        return _arm_oom(args, call)
    try:
        params = {
            "steps": str(args.steps),
            "seconds": f"{args.seconds:g}",
            "memory": "1" if args.memory else "0",
        }
        answer = call("/debug/profile", "POST", **params)
        state = _document(answer)
        if answer.status != 202:
            print(f"inferwatch profile: refused ({answer.status}): {state.get('error')}", file=sys.stderr)
            return EXIT_FAILED
        # The capture waits up to --seconds for a first step, then runs up to --seconds.
        deadline = time.monotonic() + 2 * args.seconds + WRITE_GRACE_SECONDS
        while state.get("state") not in ("done", "failed"):
            if time.monotonic() > deadline:
                print(
                    f"inferwatch profile: capture {state.get('id')} still {state.get('state')}: the serving "
                    "thread has not come back to a step boundary",
                    file=sys.stderr,
                )
                return EXIT_FAILED
            time.sleep(POLL_SECONDS)
            state = _document(call("/debug/profile", id=state["id"]))
        if state["state"] == "failed":
            print(f"inferwatch profile: capture {state['id']} failed: {state['error']}", file=sys.stderr)
            return EXIT_FAILED
        trace = call("/debug/profile/trace", id=state["id"])
        if trace.status != 200:
            print(f"inferwatch profile: no trace: {_document(trace).get('error')}", file=sys.stderr)
            return EXIT_FAILED
        memory = call("/debug/profile/memory", id=state["id"]) if state.get("memory_file") else None
    except FetchError as exc:
        print(f"inferwatch profile: {base}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / Path(state["trace_file"]).name  # the server's name, stripped of any directory
    path.write_bytes(trace.body)
    if memory is not None and memory.status == 200:
        (args.out / Path(state["memory_file"]).name).write_bytes(memory.body)
    started = time.process_time()
    summary = summarize(load_trace(path))
    analysis = time.process_time() - started
    if args.json:
        document = {
            "capture": state,
            "trace": str(path),
            "analysis_cpu_seconds": analysis,
            **summary.to_dict(),
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        heading = (
            f"inferwatch profile: {base}, capture {state['id']}: {state['steps_captured']} steps "
            f"(stopped by {state['stopped_by']}), trace {path} ({state['trace_bytes']} bytes, "
            f"{state['trace_gzip_bytes']} compressed)"
        )
        if state.get("memory_file"):
            heading += f"; memory snapshot {args.out / state['memory_file']}"
        print(render_text(summary, heading))
    return 0
