"""The floor under timing generate's compiled decode step: what each kind of per-step work around the
compiled call costs on this host, variant by variant, interleaved in one run (issue 18).

Variants, each a ``generate`` of ``--new-tokens`` greedy tokens with a static cache:

* ``bare``: the model as it is;
* ``wrapper``: ``get_compiled_call`` wrapped on the instance; the compiled call goes through a Python
  closure that only calls it (what any wrapper costs);
* ``marks``: the closure records two clock marks per step (CUDA events from a pool made before the
  call, the current stream fixed) and keeps them in a list: the least a step timed from around the call
  can do, with nothing resolved;
* ``hooks``: two forward hooks registered on the model that trace to nothing, left in while the
  compiled call runs (inferwatch takes its own out: ``ForwardHooks.hide``);
* ``inferwatch``: ``instrument()`` for the call, ``remove()`` after it.

Each round runs every variant once (the order rotates); a variant's figure is the median of its per-round
throughput ratios against ``bare``, with the 95 % bootstrap confidence interval of that median. On the
CPU the step is compiled with dynamo's eager backend (no C compiler), as in hook_cost.py.

    python tests/benchmarks/compiled_floor.py [--model llama-1b] [--batch 1] [--new-tokens 128]
        [--rounds 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (
    PAIRED_RATIO_COLUMNS,
    environment,
    paired_ratios,
    print_table,
    static_cache,
    timed_generate,
    write_json,
)
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.timing.clock import clock_for

VARIANTS = ("bare", "wrapper", "marks", "hooks", "inferwatch")


def _traced_to_nothing(*args: Any) -> None:
    if torch.compiler.is_compiling():
        return


class Floor:
    """One model and prompt, and a way to run each variant's generate."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> None:
        self.model, self.ids, self.new_tokens = model, ids, new_tokens
        self.generate_kwargs = static_cache(ids.device.type)
        self.clock = clock_for(ids.device)

    def _through(self, make: Callable[[Any], Any]) -> float:
        """The generate's wall time with the compiled call replaced by ``make(compiled)``."""
        model, original = self.model, type(self.model).get_compiled_call
        model.get_compiled_call = lambda *args, **kwargs: make(original(model, *args, **kwargs))
        try:
            return timed_generate(model, self.ids, self.new_tokens, **self.generate_kwargs)
        finally:
            del model.get_compiled_call

    def run(self, variant: str) -> float:
        model = self.model
        if variant == "bare":
            return timed_generate(model, self.ids, self.new_tokens, **self.generate_kwargs)
        if variant == "wrapper":
            return self._through(lambda compiled: lambda *args, **kwargs: compiled(*args, **kwargs))
        if variant == "marks":
            # Made before the call: only the records are the step's.
            clock = self.clock
            made = [clock.mark() for _ in range(2 * self.new_tokens + 8)]
            clock.release_all(made)
            mark, marks = clock.marker(), []

            def marking(compiled: Any) -> Any:
                def call(*args: Any, **kwargs: Any) -> Any:
                    start = mark()
                    output = compiled(*args, **kwargs)
                    marks.append(start)
                    marks.append(mark())
                    return output

                return call

            seconds = self._through(marking)
            clock.release_all(marks)
            return seconds
        if variant == "hooks":
            handles = [
                model.register_forward_pre_hook(_traced_to_nothing, with_kwargs=True),
                model.register_forward_hook(_traced_to_nothing, with_kwargs=True),
            ]
            try:
                return timed_generate(model, self.ids, self.new_tokens, **self.generate_kwargs)
            finally:
                for handle in handles:
                    handle.remove()
        handle = instrument(model, model_name="floor", registry=CollectorRegistry())
        try:
            return timed_generate(model, self.ids, self.new_tokens, **self.generate_kwargs)
        finally:
            handle.flush(30)
            handle.remove()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="llama-1b" if torch.cuda.is_available() else "tiny-llama")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", help="also write the rows and environment to this file")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else None
    model = build_model(args.model, device=args.device, dtype=dtype)
    ids = torch.randint(10, model.config.vocab_size, (args.batch, 128), device=args.device)
    floor = Floor(model, ids, args.new_tokens)
    for variant in VARIANTS * 2:  # compiled, CUDA graphs recorded, every variant warm
        floor.run(variant)
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_ in range(args.rounds):
        shift = round_ % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            seconds[variant].append(floor.run(variant))
    bare = seconds["bare"]
    rows = []
    for variant in VARIANTS[1:]:
        summary = paired_ratios([b / s for b, s in zip(bare, seconds[variant], strict=True)])
        step_ms = 1e3 * sorted(bare)[len(bare) // 2] / args.new_tokens
        added_us = (1 - summary["ratio_median"]) * step_ms * 1e3
        rows.append({"variant": variant, "step_ms": step_ms, "added_us": added_us, **summary})
    env = environment()
    print(f"# compiled_floor {env} model={args.model} batch={args.batch} new_tokens={args.new_tokens}")
    print_table(
        rows,
        [
            ("variant", "variant", str),
            *PAIRED_RATIO_COLUMNS[:2],
            ("added_us", "≈ µs per step", lambda v: f"{v:.1f}"),
            ("step_ms", "bare step ms", lambda v: f"{v:.3f}"),
        ],
    )
    write_json(args.json, {"environment": env, "args": vars(args), "rows": rows, "seconds": seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
