"""What the host pays per call, warm, for the pieces a decode step of inferwatch is made of: a clock mark,
a histogram observation, a small CUDA op, the forward hooks, and a compiled decode step's wrapper and its
share of resolving; the CUDA calls where there is a GPU. A loop of plain Python says how fast the host
runs Python, to compare hosts.

Each figure is the best of 5 repetitions of a tight loop (caches warm, no model running in between): the
floor under what ``hook_cost.py`` measures in place, where the model's own work between two steps evicts
inferwatch's code and data from the CPU caches.

    python tests/benchmarks/host_costs.py
"""

from __future__ import annotations

import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Histogram

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.metrics.observations import Observations, observe_many
from inferwatch.instrumentation.timing.clock import clock_for
from inferwatch.instrumentation.timing.request import (
    CURRENT_REQUEST,
    RUN_DRAIN_MARKS,
    DecodeRun,
    Request,
    Step,
)


def report(name: str, call: Callable[[], Any], number: int = 20000) -> None:
    call()
    best = min(timeit.repeat(call, number=number, repeat=5)) / number
    print(f"| {name} | {best * 1e6:.2f} |")


def python_loop() -> int:
    total = 0
    for i in range(1000):
        total += i
    return total


def compiled_step_costs(instrumentation: Any, clock: Any, ids: torch.Tensor) -> None:
    """A compiled decode step's share: the wrapper generate calls instead of the compiled call (around a
    call that does nothing, with the keyword arguments of a decode step), and resolving a run."""
    model = instrumentation.model
    request = Request(model.series, clock, owner=model, background=model.background)
    token = CURRENT_REQUEST.set(request)
    run = DecodeRun(clock, str(ids.device), 1, 0.0)
    request.begin_run(run)
    request.timeline.place(time.perf_counter(), 1, model.series, Observations())
    step_kwargs = {
        "input_ids": ids,
        "position_ids": ids,
        "cache_position": ids[0],
        "past_key_values": None,
        "attention_mask": None,
        "use_cache": True,
        "return_dict": True,
    }

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def through(*args: Any, **kwargs: Any) -> None:
        return nothing(*args, **kwargs)

    forward = instrumentation.compiled.timed_around(nothing)

    def step() -> None:
        forward(**step_kwargs)
        if len(run.marks) == RUN_DRAIN_MARKS - 2:  # the wrapper would resolve at the next step
            clock.release_all(run.marks)
            run.marks.clear()

    report("a closure calling through, a decode step's keywords", lambda: through(**step_kwargs))
    report("the compiled step's wrapper with a DecodeRun, no resolving", step)
    clock.release_all(run.marks)
    run.marks.clear()
    for _ in range(RUN_DRAIN_MARKS // 2 - 1):
        forward(**step_kwargs)
    if ids.is_cuda:
        torch.cuda.synchronize()
    recorded = list(run.marks)
    pool = getattr(clock, "_pool", None)  # CUDA events, given back to it by each resolution

    def resolve_run() -> None:
        run.marks[:] = recorded
        request.drain()
        if pool is not None:
            pool.clear()  # the next repetition reuses ``recorded``

    steps = len(recorded) // 2
    best = min(timeit.repeat(resolve_run, number=200, repeat=5)) / 200
    print(f"| Request.drain of a run of {steps} steps, per step | {best / steps * 1e6:.2f} |")
    CURRENT_REQUEST.reset(token)


def cuda_calls(clock: Any, device: torch.device) -> None:
    """The CUDA calls a step of inferwatch makes (or made, before it learnt better)."""
    event, stream = torch.cuda.Event(enable_timing=True), torch.cuda.current_stream()
    flags = torch.zeros(8, dtype=torch.bool, device=device)
    earlier, later = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    earlier.record()
    later.record()
    torch.cuda.synchronize()
    report("torch.cuda.Event.record(stream)", lambda: event.record(stream))
    record = torch._C._CudaEventBase.record
    report("the same through torch._C._CudaEventBase.record", lambda: record(event, stream))
    report("CudaClock.mark() + release", lambda: clock.release(clock.mark()))
    report("torch._C._cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0))
    report("torch.cuda.current_stream()", torch.cuda.current_stream)
    report("bool | bool on CUDA (8 elements)", lambda: flags | flags)
    report("Event.elapsed_time", lambda: earlier.elapsed_time(later))
    report("Event.query", earlier.query)


def main() -> int:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    clock = clock_for(device)
    histogram = Histogram("x", "x", buckets=[i * 0.001 for i in range(1, 30)], registry=CollectorRegistry())
    # A run's inter-token latencies: spread over two buckets.
    latencies = [0.0025 + (i % 7) * 0.0001 for i in range(64)]

    print(f"# host_costs on {device}\n| call | µs |\n|---|---|")
    report("a Python loop of 1000 additions", python_loop, number=2000)
    report("time.perf_counter()", time.perf_counter)
    if cuda:
        cuda_calls(clock, device)
    report("ContextVar.get", CURRENT_REQUEST.get)
    report("torch.compiler.is_compiling()", torch.compiler.is_compiling)
    report(
        "Step(...) by keyword",
        lambda: Step(
            series=None,
            device="d",
            phase="decode",
            start=1,
            end=2,
            tokens=1,
            start_host=1.0,
            end_host=2.0,
            batch=1,
            processed=1,
        ),
    )
    report("Histogram.observe (29 buckets)", lambda: histogram.observe(0.02))
    report("observe_many, 64 values in two of the 29 buckets", lambda: observe_many(histogram, latencies))

    model = build_model("small-llama", device=device.type, dtype=torch.bfloat16 if cuda else None)
    ids = torch.randint(10, 200, (1, 1), device=device)
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    instrumentation = handle._instrumentation
    request = Request(
        instrumentation.model.series,
        clock,
        owner=instrumentation.model,
        background=instrumentation.model.background,
    )
    CURRENT_REQUEST.set(request)
    with torch.inference_mode():
        output = model(ids)

        def forward_hooks() -> None:
            instrumentation.forward_hooks.before(model, (ids,), {})
            instrumentation.forward_hooks.after(model, (ids,), {}, output)

        report("ForwardHooks.before + after, inside a request", forward_hooks, number=2000)
        report("Request.mark_tokens", lambda: request.mark_tokens(str(device), 1), number=2000)
        compiled_step_costs(instrumentation, clock, ids)
        report("small-llama forward of one token, instrumented", lambda: model(ids), number=200)
        handle.remove()
        report("small-llama forward of one token, bare", lambda: model(ids), number=200)
    return 0


if __name__ == "__main__":
    sys.exit(main())
