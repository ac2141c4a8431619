"""generate's fastest decode path on the GPU: a static cache, with which transformers compiles the forward
(inductor, ``reduce-overhead``: CUDA graphs), instrumented against bare, interleaved in one run.

For each batch size (``--batch``), after a warm-up that compiles the step with and without inferwatch:

* **Throughput**: ``--pairs`` pairs of a bare and an instrumented ``generate`` of ``--new-tokens`` greedy
  tokens (the order alternates; instrument() and remove() around each instrumented run, as a deployment
  that turns inferwatch on would), tokens/s of the whole call (its eager prefill included). The figure is
  the median of the per-pair ratios with its 95 % bootstrap confidence interval. Many short pairs rather
  than a few long ones: the host drifts by about a point between runs, and what resolves a 0.5 % cost is
  the interval's half-width (``--resolution``), which shrinks with the number of pairs.
* **Compilation**: dynamo's counters (graphs compiled, frames, graph breaks) read after the warm-up and
  after the last pair: instrumenting and removing must not compile anything again or break a graph.

Exit status 1 when a confidence interval's lower bound is under ``--target``, its half-width over
``--resolution``, or a counter moved.

    python tests/benchmarks/gpu_compiled.py [--model llama-1b] [--batch 1 8] [--pairs 240] [--json OUT]

The per-step host cost of the hooks on this path comes from ``hook_cost.py --static``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (
    PAIRED_RATIO_COLUMNS,
    environment,
    median,
    paired_ratios,
    print_table,
    static_cache,
    timed_generate,
    write_json,
)
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model


def dynamo_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "frames": int(counters["frames"]["total"]),
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def one_run(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, instrumented: bool) -> float:
    """Tokens/s of one static-cache generate, bare or instrumented for the length of the call."""
    handle = instrument(model, model_name="bench", registry=CollectorRegistry()) if instrumented else None
    try:
        seconds = timed_generate(model, ids, new_tokens, **static_cache("cuda"))
    finally:
        if handle is not None:
            handle.flush(30)
            handle.remove()
    return ids.shape[0] * new_tokens / seconds


def measure(model: torch.nn.Module, batch: int, new_tokens: int, pairs: int) -> dict[str, Any]:
    ids = torch.randint(10, model.config.vocab_size, (batch, 128), device="cuda")
    for instrumented in (False, True, False, True):  # compile, then the CUDA graphs of both modes
        one_run(model, ids, new_tokens, instrumented)
    assert hasattr(model, "_compiled_call"), "transformers did not take its compiled path"
    before = dynamo_counters()
    ratios, bare, watched = [], [], []
    for pair in range(pairs):
        rates = {}
        for instrumented in (False, True) if pair % 2 == 0 else (True, False):
            rates[instrumented] = one_run(model, ids, new_tokens, instrumented)
        bare.append(rates[False])
        watched.append(rates[True])
        ratios.append(rates[True] / rates[False])
    after = dynamo_counters()
    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "bare_tokens_per_s": median(bare),
        "inferwatch_tokens_per_s": median(watched),
        "step_ms": 1e3 * batch / median(bare),
        **paired_ratios(ratios),
        "dynamo_before": before,
        "dynamo_after": after,
        "dynamo_unchanged": before == after,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=240)
    parser.add_argument(
        "--resolution", type=float, default=0.005, help="the widest half-width of a 95 %% CI that resolves"
    )
    parser.add_argument("--target", type=float, default=0.995)
    parser.add_argument("--json", help="also write the rows and environment to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_compiled: no CUDA device", file=sys.stderr)
        return 2
    model = build_model(args.model, device="cuda", dtype=torch.bfloat16)
    rows = [measure(model, batch, args.new_tokens, args.pairs) for batch in args.batch]
    env = environment()
    print(f"# gpu_compiled {env} model={args.model} new_tokens={args.new_tokens} pairs={args.pairs}")
    print_table(
        rows,
        [
            ("batch", "batch", str),
            ("step_ms", "step ms (bare)", lambda v: f"{v:.2f}"),
            ("bare_tokens_per_s", "bare tok/s", lambda v: f"{v:.0f}"),
            ("inferwatch_tokens_per_s", "instrumented tok/s", lambda v: f"{v:.0f}"),
            *PAIRED_RATIO_COLUMNS,
            ("dynamo_unchanged", "no recompile / break", str),
        ],
    )
    for row in rows:
        low, high = row["ratio_ci95"]
        row["ci_half_width"] = (high - low) / 2
        row["resolved"] = row["ci_half_width"] <= args.resolution
        print(f"batch {row['batch']}: CI half-width {row['ci_half_width']:.2%} (resolved: {row['resolved']})")
    missed = [
        row
        for row in rows
        if row["ratio_ci95"][0] < args.target or not row["dynamo_unchanged"] or not row["resolved"]
    ]
    for row in missed:
        print(f"MISSED at batch {row['batch']}")
    write_json(args.json, {"environment": env, "args": vars(args), "rows": rows})
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
