"""Continuous batching on the GPU: per-request accuracy against a synchronized ground truth, and decode
throughput instrumented vs bare, interleaved in one run (issue 16's proof).

``python tests/benchmarks/gpu_batching.py --json OUT.json`` builds a ~1B model (``llama-1b``, bf16) and
runs ``generate_batch`` with 32 and 128 concurrent requests of different prompt lengths.

* **Throughput**: ``--pairs`` interleaved pairs of a bare and an instrumented run (the order alternates).
  A run's decode throughput is the tokens after each request's first, divided by the window from the
  first to the last token on the manager's own clock (``record_timestamps``): the manager's start-up and
  warmup are outside it. The figure is the median of the per-pair ratios, with the spread and the 95 %
  bootstrap confidence interval of the median.
* **Accuracy**: one instrumented run per size with a ground-truth timer on transformers' ``ModelRunner``
  (the class, under inferwatch's instance hook): ``torch.cuda.synchronize()`` after every step's compute,
  then the host clock. Every token the manager timestamps belongs to the last step that completed before
  that timestamp, so its true time is that step's synchronized end; TTFT is measured from the request's
  ``created_time``. inferwatch's per-request TTFT and time per output token (the histograms'
  observations, recorded as they are made) are compared with the truth as sorted lists.

Exit status 1 when the throughput ratio's median misses ``--target`` or a TTFT misses max(1 ms, 1 %).
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: tests.support
from bench_common import PAIRED_RATIO_COLUMNS, environment, median, paired_ratios, print_table, write_json
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from tests.support.observations import ObservationRecorder

MODEL_NAME = "bench"


def prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, 512, (count,), generator=generator).tolist()
    return [torch.randint(10, vocab, (n,), generator=generator).tolist() for n in lengths]


def decode_throughput(outputs: list[Any]) -> float:
    first = min(o.timestamps[0] for o in outputs)
    last = max(o.timestamps[-1] for o in outputs)
    tokens = sum(len(o.generated_tokens) - 1 for o in outputs)
    return tokens / (last - first)


def run(model: Any, batch: list[list[int]], new_tokens: int, **batching: Any) -> list[Any]:
    """``generate_batch`` greedy, without EOS, with the manager's timestamps; ``batching`` goes to its
    ContinuousBatchingConfig."""
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    cb_config = ContinuousBatchingConfig(**batching) if batching else None
    results = model.generate_batch(
        batch, generation_config=config, continuous_batching_config=cb_config, record_timestamps=True
    )
    return list(results.values())


class SynchronizedSteps:
    """Ground truth: the host time each step's compute was complete (synchronize, then the clock)."""

    def __init__(self) -> None:
        from transformers.generation.continuous_batching.model_runner import ModelRunner

        self.ends: list[float] = []
        self._class = ModelRunner
        self._original = ModelRunner.compute_batch
        ends, original = self.ends, self._original

        def compute_batch(runner: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(runner, *args, **kwargs)
            torch.cuda.synchronize()
            ends.append(time.perf_counter())
            return result

        ModelRunner.compute_batch = compute_batch

    def remove(self) -> None:
        self._class.compute_batch = self._original

    def token_time(self, stamp: float) -> float:
        """The synchronized end of the last step that completed before the manager stamped a token."""
        return self.ends[bisect.bisect_right(self.ends, stamp) - 1]


def spread(ours: list[float], truth: list[float]) -> dict[str, float]:
    """Sorted per-request values: the largest absolute and relative differences."""
    pairs = list(zip(sorted(ours), sorted(truth), strict=True))
    absolute = [abs(a - b) for a, b in pairs]
    relative = [abs(a - b) / b for a, b in pairs if b > 0]
    return {
        "max_abs_ms": max(absolute) * 1e3,
        "median_abs_ms": statistics.median(absolute) * 1e3,
        "max_rel": max(relative),
        "within_1ms_or_1pct": sum(abs(a - b) <= max(1e-3, 0.01 * b) for a, b in pairs) / len(pairs),
    }


def accuracy(model: Any, batch: list[list[int]], new_tokens: int) -> dict[str, Any]:
    registry = CollectorRegistry()
    handle = instrument(model, model_name=MODEL_NAME, registry=registry)
    recorder = ObservationRecorder(registry, handle, MODEL_NAME, ("ttft", "tpot"))
    truth = SynchronizedSteps()
    try:
        # Synchronous batching: the manager stamps a step's tokens before the next step is launched, so
        # each stamp follows the synchronized end of the step that sampled it.
        outputs = run(model, batch, new_tokens, use_async_batching=False)
        handle.flush(30)
    finally:
        truth.remove()
        handle.remove()
    true_ttft = [truth.token_time(o.timestamps[0]) - o.created_time for o in outputs]
    true_tpot = [
        (truth.token_time(o.timestamps[-1]) - truth.token_time(o.timestamps[0])) / (len(o.timestamps) - 1)
        for o in outputs
    ]
    return {
        "requests": len(outputs),
        "observed": len(recorder.values["ttft"]),
        "ttft": spread(recorder.values["ttft"], true_ttft),
        "tpot": spread(recorder.values["tpot"], true_tpot),
        "ttft_truth_median_ms": statistics.median(true_ttft) * 1e3,
        "tpot_truth_median_ms": statistics.median(true_tpot) * 1e3,
    }


def throughput(model: Any, batch: list[list[int]], new_tokens: int, pairs: int) -> dict[str, Any]:
    ratios, bare_rates, instrumented_rates = [], [], []
    for pair in range(pairs):
        rates = {}
        for mode in ("bare", "inferwatch") if pair % 2 == 0 else ("inferwatch", "bare"):
            handle = None
            if mode == "inferwatch":
                handle = instrument(model, model_name=MODEL_NAME, registry=CollectorRegistry())
            try:
                rates[mode] = decode_throughput(run(model, batch, new_tokens))
            finally:
                if handle is not None:
                    handle.remove()
        bare_rates.append(rates["bare"])
        instrumented_rates.append(rates["inferwatch"])
        ratios.append(rates["inferwatch"] / rates["bare"])
    return {
        "bare_tokens_per_s": median(bare_rates),
        "inferwatch_tokens_per_s": median(instrumented_rates),
        **paired_ratios(ratios),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--requests", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--json", help="also write the rows and environment to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_batching: no CUDA device", file=sys.stderr)
        return 2
    model = build_model(args.model, device="cuda", dtype=torch.bfloat16)
    vocab = model.config.vocab_size
    run(model, prompts(8, vocab, seed=99), 8)  # first-use costs (kernels, allocator) outside the figures
    rows = []
    for count in args.requests:
        batch = prompts(count, vocab, seed=count)
        row = {"requests": count, **throughput(model, batch, args.new_tokens, args.pairs)}
        row["accuracy"] = accuracy(model, batch, args.new_tokens)
        rows.append(row)
    env = environment()
    print(f"# gpu_batching {env} model={args.model} new_tokens={args.new_tokens} pairs={args.pairs}")
    print_table(
        rows,
        [
            ("requests", "requests", str),
            ("bare_tokens_per_s", "bare decode tok/s", lambda v: f"{v:.0f}"),
            ("inferwatch_tokens_per_s", "instrumented tok/s", lambda v: f"{v:.0f}"),
            *PAIRED_RATIO_COLUMNS,
            ("accuracy", "TTFT max diff ms", lambda v: f"{v['ttft']['max_abs_ms']:.3f}"),
            ("accuracy", "TTFT within 1 ms/1 %", lambda v: f"{v['ttft']['within_1ms_or_1pct']:.0%}"),
            ("accuracy", "TPOT max rel diff", lambda v: f"{v['tpot']['max_rel']:.2%}"),
        ],
    )
    missed = [
        row
        for row in rows
        if row["ratio_median"] < args.target or row["accuracy"]["ttft"]["within_1ms_or_1pct"] < 1.0
    ]
    for row in missed:
        print(f"MISSED target at {row['requests']} requests")
    write_json(args.json, {"environment": env, "args": vars(args), "rows": rows})
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
