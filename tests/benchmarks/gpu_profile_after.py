"""What a profile capture leaves behind once it ends, on a GPU (issue 47): throughput after it, the exit.

Each variant is a serving process of its own, run one after the other on the otherwise idle GPU: a 1B Llama
(bf16, random weights, batch 1, eager, greedy, 32 new tokens a request) serving requests back to back on
a thread. Its throughput is measured for ``--before`` seconds, then one 20-step capture is taken, then
the throughput is measured in 5 s windows from 5 s to ``--after`` seconds after the capture ended:

* **torch**: ``torch.profiler`` (CPU and CUDA) over one request on the serving thread, as a user would,
  with the environment as torch leaves it (kineto keeps CUPTI attached unless ``TEARDOWN_CUPTI=1``);
* **inferwatch**: instrumented, its endpoint started with ``INFERWATCH_PROFILE=1``, and the capture asked
  for with ``inferwatch profile URL --steps 20``, the command a user runs.

Throughput is 32 tokens over the median wall time of the requests that ended in a window (not requests
counted per window, which moves in steps of a whole request). Checks for ``inferwatch``: every window
after the capture at least 0.98 of the median before; exit status 0 with no "terminate called" and no
"External init callback" line in its output. ``torch`` is the reference the issue asked for: whether
torch's profiler alone leaves the cost. About three minutes. On the GPU machine (the endpoint needs
uvicorn and httptools: carried wheels there)::

    python3 tests/benchmarks/gpu_profile_after.py --json "$OUT/profile_after.json"

Exit status 0 when every check holds, 1 when one does not, 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import write_json

WINDOW_SECONDS = 5.0
BAD_LINES = ("terminate called", "External init callback")

# The serving process: prints one JSON line of request ends and durations, and the capture's times.
SERVING = r"""
import json, os, subprocess, sys, threading, time
import torch
from inferwatch.instrumentation.demo.models import build_model
variant, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
model = build_model("llama-1b", device="cuda", dtype=torch.bfloat16)
ids = torch.randint(10, 1000, (1, 32), device="cuda")
mask = torch.ones_like(ids)
server = None
if variant == "inferwatch":
    from inferwatch.instrumentation import instrument
    from inferwatch.instrumentation.endpoint.server import start_http_server
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    instrument(model, model_name="m", registry=registry)
    server = start_http_server(port=0, addr="127.0.0.1", registry=registry)
requests, stop, profile_next = [], threading.Event(), threading.Event()

def generate(tokens):
    model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)

def serve():
    while not stop.is_set():
        if profile_next.is_set():
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities):
                generate(20)
            profile_next.clear()
            continue
        started = time.perf_counter()
        generate(32)
        torch.cuda.synchronize()
        requests.append((time.perf_counter(), time.perf_counter() - started))

thread = threading.Thread(target=serve, name="serving")
thread.start()
time.sleep(3.0)  # warm: the first requests pay for allocations
measured_from = time.perf_counter()
time.sleep(before)
capture_started = time.perf_counter()
if variant == "inferwatch":
    command = [sys.executable, "-m", "inferwatch.cli", "profile", server.url, "--steps", "20", "--json",
               "--out", os.environ["PROFILE_OUT"]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    print("capture:", done.returncode, done.stdout[-300:].replace("\n", " "), done.stderr[-300:], flush=True)
else:
    profile_next.set()
    while profile_next.is_set():
        time.sleep(0.01)
capture_ended = time.perf_counter()
time.sleep(after)
stop.set()
thread.join()
result = {"requests": requests, "measured_from": measured_from, "capture_started": capture_started,
          "capture_ended": capture_ended}
print("RESULT " + json.dumps(result), flush=True)
"""


def tokens_per_second(requests: list[tuple[float, float]], start: float, end: float) -> float | None:
    """32 tokens over the median wall time of the requests that ended in [start, end): the median, as the
    shared host's hiccups stretch single requests by a third."""
    inside = [seconds for ended, seconds in requests if start <= ended < end]
    return 32 / statistics.median(inside) if inside else None


def run_variant(variant: str, before: float, after: float, out: Path) -> dict[str, Any]:
    env = {**os.environ, "INFERWATCH_PROFILE": "1", "PROFILE_OUT": str(out / f"traces-{variant}")}
    env.pop("TEARDOWN_CUPTI", None)
    command = [sys.executable, "-c", SERVING, variant, str(before), str(after)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=before + after + 240, env=env)
    output = done.stdout + done.stderr
    result_line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    row: dict[str, Any] = {
        "variant": variant,
        "exit_status": done.returncode,
        "bad_lines": [line for line in output.splitlines() if any(bad in line for bad in BAD_LINES)],
        "capture_lines": [line for line in done.stdout.splitlines() if line.startswith("capture:")],
    }
    if result_line is None:
        row["error"] = output[-3000:]
        return row
    result = json.loads(result_line.removeprefix("RESULT "))
    requests = [tuple(r) for r in result["requests"]]
    before_windows = [
        tokens_per_second(requests, t, t + WINDOW_SECONDS)
        for t in frange(result["measured_from"], result["capture_started"] - WINDOW_SECONDS)
    ]
    baseline = statistics.median(v for v in before_windows if v is not None)
    ended = result["capture_ended"]
    after_windows = {
        f"+{offset:.0f}s": tokens_per_second(requests, ended + offset, ended + offset + WINDOW_SECONDS)
        for offset in frange(5.0, after - WINDOW_SECONDS + 0.01)
    }
    row.update(
        before_tokens_per_s=baseline,
        before_windows=before_windows,
        capture_seconds=ended - result["capture_started"],
        after_ratio={k: (v / baseline if v else None) for k, v in after_windows.items()},
    )
    ratios = [r for r in row["after_ratio"].values() if r is not None]
    row["after_ratio_min"] = min(ratios, default=None)
    row["after_ratio_median"] = statistics.median(ratios) if ratios else None
    return row


def frange(start: float, stop: float) -> list[float]:
    return [start + i * WINDOW_SECONDS for i in range(max(0, int((stop - start) // WINDOW_SECONDS) + 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--after", type=float, default=60.0)
    parser.add_argument("--variants", nargs="+", default=["torch", "inferwatch"])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_profile_after: no CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.json).parent if args.json else Path("/tmp")
    rows = [run_variant(variant, args.before, args.after, out) for variant in args.variants]
    checks: dict[str, bool] = {}
    for row in rows:
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in row.get("after_ratio", {}).items() if v is not None)
        print(
            f"{row['variant']}: exit {row['exit_status']}, "
            f"before {row.get('before_tokens_per_s', 0):.1f} tok/s, "
            f"capture {row.get('capture_seconds', 0):.2f} s, after/before: {ratios}; "
            f"bad lines {row['bad_lines']} {row.get('error', '')}"
        )
        if row["variant"] == "inferwatch":
            checks["after >= 0.98 of before, every window"] = (row.get("after_ratio_min") or 0) >= 0.98
            checks["clean exit"] = row["exit_status"] == 0
            checks["no error line"] = not row["bad_lines"]
    print("checks:", checks)
    write_json(args.json, {"rows": rows, "checks": checks})
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
