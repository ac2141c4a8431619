"""Where inferwatch's time goes per step: wall time of each hook and helper, per call, on a real model.

Wraps the hook methods of the instrumentation (class attributes, before ``instrument()`` binds them) with
``perf_counter`` accumulators, runs instrumented ``generate`` calls, and prints the mean cost per call,
and per forward the host time of the serving thread's hot path (the forward hooks, the compiled call's
wrapper and the sampled-token criterion), and the part of it spent resolving earlier steps; then
interleaves plain and instrumented runs for the end-to-end ratio, and prints a cProfile of one
instrumented ``generate`` restricted to inferwatch's and torch.cuda's functions.

    python tests/benchmarks/hook_cost.py [--model small-llama] [--device cuda] [--static]

``--static``: a static cache, with which transformers compiles the decode step on CUDA.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import timed_generate
from inferwatch.instrumentation import hooks, instrument, request
from inferwatch.instrumentation.models import build_model
from prometheus_client import CollectorRegistry

COSTS: dict[str, list[float]] = collections.defaultdict(list)
#: What the serving thread runs on every forward (the compiled call's wrapper calls the forward hooks).
HOT_PATH = [
    (hooks.ModelInstrumentation, "_forward_pre"),
    (hooks.ModelInstrumentation, "_forward_post"),
    (hooks.SampledTokenMarks, "__call__"),
]
TIMED = [
    *HOT_PATH,
    (hooks.ModelInstrumentation, "_begin"),
    (hooks.ModelInstrumentation, "_succeed"),
    (hooks.ModelInstrumentation, "_token_counts"),
    (hooks.ModelInstrumentation, "_with_token_marks"),
    (request.Request, "drain"),
    (request.Request, "_resolve"),
]


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced into a compiled region: no clock there
            return function(*args, **kwargs)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            COSTS[name].append(time.perf_counter() - start)

    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--static", action="store_true", help="a static cache (compiled decode on CUDA)")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else None
    model = build_model(args.model, device=args.device, dtype=dtype)
    ids = torch.randint(0, 256, (args.batch, 128), device=args.device)
    extra = {"cache_implementation": "static"} if args.static else {}
    for _ in range(2):  # with --static: compiled, then the CUDA graphs recorded
        timed_generate(model, ids, args.new_tokens, **extra)

    plain, watched = [], []
    for _ in range(args.repeats):
        plain.append(timed_generate(model, ids, args.new_tokens, **extra))
        handle = instrument(model, model_name="m", registry=CollectorRegistry())
        timed_generate(model, ids, 4, **extra)
        watched.append(timed_generate(model, ids, args.new_tokens, **extra))
        handle.remove()
    ratio = statistics.median(plain) / statistics.median(watched)
    per_step = (statistics.median(watched) - statistics.median(plain)) / args.new_tokens
    print(f"# {args.model} on {args.device}: instrumented at {ratio:.2%} of plain speed")
    plain_step = statistics.median(plain) / args.new_tokens
    print(f"# added per step: {per_step * 1e6:.1f} µs (plain step {plain_step * 1e3:.3f} ms)")

    originals = [(owner, name, getattr(owner, name)) for owner, name in TIMED]
    for owner, name, original in originals:
        setattr(owner, name, timed(f"{owner.__name__}.{name}", original))
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    for _ in range(args.repeats):
        timed_generate(model, ids, args.new_tokens, **extra)
    handle.flush()
    print("\n| function | calls | mean µs | max µs |\n|---|---|---|---|")
    for name, costs in COSTS.items():
        print(f"| {name} | {len(costs)} | {statistics.mean(costs) * 1e6:.1f} | {max(costs) * 1e6:.1f} |")
    forwards = args.repeats * args.new_tokens
    hot = sum(sum(COSTS[f"{owner.__name__}.{name}"]) for owner, name in HOT_PATH)
    resolving = sum(COSTS["Request._resolve"])
    print(f"# hot path per forward (serving thread): {hot / forwards * 1e6:.1f} µs")
    print(f"# of which resolving, per forward (in batches): {resolving / forwards * 1e6:.1f} µs")

    profile = cProfile.Profile()
    profile.enable()
    timed_generate(model, ids, args.new_tokens, **extra)
    profile.disable()
    handle.remove()
    for owner, name, original in originals:
        setattr(owner, name, original)
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(r"instrumentation|cuda|prometheus", 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
