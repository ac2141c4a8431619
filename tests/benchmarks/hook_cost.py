"""Where inferwatch's time goes per step: host time of each hook and helper, per call, on a real model.

Wraps the hook methods of the instrumentation (class attributes, before ``instrument()`` binds them) with
``perf_counter`` accumulators, runs instrumented ``generate`` calls, and prints the mean cost per call
and, per forward, the host time of the serving thread's hot path: the forward hooks, the compiled call's
wrapper and the token-marking criteria, with the earlier steps they resolve. Each function is charged its
own time only: what it calls that is timed too (transformers' criteria, the compiled forward, a nested
hook) is taken out. Then it interleaves plain and instrumented runs for the end-to-end ratio, and prints a
cProfile of one instrumented ``generate`` restricted to inferwatch's and torch.cuda's functions.

    python tests/benchmarks/hook_cost.py [--model small-llama] [--device cuda] [--static] [--batch N]
    python tests/benchmarks/hook_cost.py --batching 32 [--model llama-1b] [--new-tokens 64]

``--static``: a static cache, with which transformers compiles the decode step (on the CPU, with
dynamo's eager backend: the same decode path without a C compiler). ``--batching N``: continuous batching
of N requests (``generate_batch``); the figure is the hooks' host time per step of the manager's loop.
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
from transformers.generation.stopping_criteria import StoppingCriteriaList

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import static_cache, timed_generate
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.batching import batch_timeline
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.model import criteria
from inferwatch.instrumentation.model.compiled import CompiledPath
from inferwatch.instrumentation.model.forward import ForwardHooks
from inferwatch.instrumentation.model.generate import GenerateWrapper
from inferwatch.instrumentation.timing import request

COMPILED_FORWARD = "compiled_forward"
#: What the serving thread runs on every forward (the compiled call's wrapper calls the forward hooks).
HOT_PATH = [
    (ForwardHooks, "before"),
    (ForwardHooks, "after"),
    (criteria.token_marking_criteria(), "__call__"),
]
RESOLVING = [(request.Request, "drain"), (request.Request, "_resolve"), (request.Request, "_resolve_run")]
RESOLVING_NAMES = {f"{owner.__name__}.{name}" for owner, name in RESOLVING}
TIMED = [
    *HOT_PATH,
    *RESOLVING,
    (GenerateWrapper, "_begin"),
    (GenerateWrapper, "_succeed"),
    (GenerateWrapper, "_token_counts"),
]
#: transformers' own work, called from inside inferwatch's: timed only to be taken out.
FOREIGN = [(StoppingCriteriaList, "__call__")]

COSTS: dict[str, list[float]] = collections.defaultdict(list)
#: Own time by the outermost timed inferwatch function it ran under (the hot path, or a request's exit).
BY_CALLER: dict[str, float] = collections.defaultdict(float)
RESOLVED_BY_CALLER: dict[str, float] = collections.defaultdict(float)
_STACK: list[list[Any]] = []  # [name, time spent in timed callees]


def timed(name: str, function: Callable[..., Any], *, foreign: bool = False) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced into a compiled region: no clock there
            return function(*args, **kwargs)
        frame = [name, 0.0]
        _STACK.append(frame)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            _STACK.pop()
            if _STACK:
                _STACK[-1][1] += spent
            if not foreign:
                own = spent - frame[1]
                COSTS[name].append(own)
                outermost = next(entry[0] for entry in [*_STACK, frame] if entry[0] not in FOREIGN_NAMES)
                BY_CALLER[outermost] += own
                if name in RESOLVING_NAMES:
                    RESOLVED_BY_CALLER[outermost] += own

    return wrapper


FOREIGN_NAMES = {"compiled call", *(f"{owner.__name__}.{name}" for owner, name in FOREIGN)}


def time_compiled_calls() -> Callable[[], None]:
    """Time the wrapper generate gets from ``get_compiled_call`` (own time: without the compiled call
    inside it); returns the undo."""
    original = CompiledPath.timed_around

    def timed_around(self: CompiledPath, compiled: Any) -> Any:
        inner = timed("compiled call", compiled, foreign=True)
        return timed(COMPILED_FORWARD, original(self, inner))

    CompiledPath.timed_around = timed_around
    return lambda: setattr(CompiledPath, "timed_around", original)


def install_timers(timed_functions: list[tuple[Any, str]]) -> Callable[[], None]:
    """Wrap ``timed_functions`` (ours) and FOREIGN (transformers') with timers; returns the undo."""
    originals = [(owner, name, getattr(owner, name)) for owner, name in [*timed_functions, *FOREIGN]]
    for owner, name, original in originals:
        label = f"{owner.__name__}.{name}"
        setattr(owner, name, timed(label, original, foreign=(owner, name) in FOREIGN))
    undo_compiled = time_compiled_calls()

    def undo() -> None:
        undo_compiled()
        for owner, name, original in originals:
            setattr(owner, name, original)

    return undo


def print_costs() -> float:
    """The per-call table; returns the total own time of every timed inferwatch function."""
    print("\n| function | calls | mean µs (own) | max µs |\n|---|---|---|---|")
    for name, costs in COSTS.items():
        print(f"| {name} | {len(costs)} | {statistics.mean(costs) * 1e6:.1f} | {max(costs) * 1e6:.1f} |")
    return sum(BY_CALLER.values())


def generate_costs(args: argparse.Namespace) -> None:
    """``generate`` of ``--new-tokens`` tokens, ``--repeats`` times."""
    dtype = torch.bfloat16 if args.device == "cuda" else None
    model = build_model(args.model, device=args.device, dtype=dtype)
    ids = torch.randint(0, 256, (args.batch, 128), device=args.device)
    extra = static_cache(args.device) if args.static else {}
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

    undo = install_timers(TIMED)
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    for _ in range(args.repeats):
        timed_generate(model, ids, args.new_tokens, **extra)
    handle.flush()
    total = print_costs()
    forwards = args.repeats * args.new_tokens
    hot_names = [COMPILED_FORWARD, *(f"{owner.__name__}.{name}" for owner, name in HOT_PATH)]
    hot = sum(BY_CALLER[name] for name in hot_names)
    resolving = sum(RESOLVED_BY_CALLER[name] for name in hot_names)
    print(f"# hot path per forward (serving thread): {hot / forwards * 1e6:.1f} µs")
    print(f"# of which resolving earlier steps: {resolving / forwards * 1e6:.1f} µs")
    print(f"# all of inferwatch per forward, entry and exit included: {total / forwards * 1e6:.1f} µs")

    profile = cProfile.Profile()
    profile.enable()
    timed_generate(model, ids, args.new_tokens, **extra)
    profile.disable()
    handle.remove()
    undo()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(r"instrumentation|cuda|prometheus", 30)


def batching_costs(args: argparse.Namespace) -> None:
    """``generate_batch`` of ``--batching`` requests of ``--new-tokens`` tokens, ``--repeats`` times: the
    host time of inferwatch's continuous-batching hooks per step of the manager's loop."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.model_runner import ModelRunner

    dtype = torch.bfloat16 if args.device == "cuda" else None
    model = build_model(args.model, device=args.device, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(32, 512, (args.batching,), generator=generator).tolist()
    prompts = [torch.randint(10, 256, (n,), generator=generator).tolist() for n in lengths]
    config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1)
    model.generate_batch(prompts, generation_config=config)  # warm-up

    step_functions = [(ModelRunner, "compute_batch")]
    FOREIGN.extend(step_functions)
    FOREIGN_NAMES.update(f"{owner.__name__}.{name}" for owner, name in step_functions)
    timeline = [
        (batch_timeline.BatchTimeline, name)
        for name in (
            "arrive",
            "requeue",
            "cancel",
            "fail",
            "deliver_one",
            "deliver",
            "compose",
            "run_step",
            "drain_or_defer",
            "drain",
        )
    ]
    undo = install_timers(timeline)
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    start = time.perf_counter()
    for _ in range(args.repeats):
        model.generate_batch(prompts, generation_config=config)
    wall = time.perf_counter() - start
    handle.flush()
    handle.remove()
    undo()
    total = print_costs()
    steps = len(COSTS["BatchTimeline.run_step"])
    step = wall / steps
    print(f"# {args.model} on {args.device}, {args.batching} requests: {steps} steps of {step * 1e3:.2f} ms")
    print(f"# all of inferwatch per step: {total / steps * 1e6:.1f} µs, {total / wall:.3%} of the wall time")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--static", action="store_true", help="a static cache (compiled decode step)")
    parser.add_argument(
        "--batching", type=int, metavar="N", help="continuous batching of N requests instead of generate"
    )
    args = parser.parse_args()
    if args.batching:
        batching_costs(args)
    else:
        generate_costs(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
