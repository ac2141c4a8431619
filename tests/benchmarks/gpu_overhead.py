"""What watching costs on a GPU: inferwatch against no instrumentation, hand-written per-step
synchronize timing, and ``torch.profiler``, interleaved in one run.

For each model and mode, with the modes' order rotated every repetition so drift hits all alike:

* TTFT — wall time of ``generate(max_new_tokens=1)``;
* decode tokens/s — generated tokens / wall time of ``generate(max_new_tokens=N)``;
* "vs none" — the median over repetitions of a mode's figure divided by the same repetition's
  uninstrumented one (paired, so slow drift of the host's speed cancels);
* synchronizations per decode step — explicit ones (``torch.cuda.synchronize``, ``Event.synchronize``,
  ``Stream.synchronize`` wrapped, every thread) and implicit ones (``torch.cuda.set_sync_debug_mode``
  warnings: ``.item()``, device-to-host copies), beyond what plain ``generate`` does.

Targets: inferwatch >= 99 % of uninstrumented tokens/s for the ~1B model, >= 98 % for the small one,
and zero added synchronizations per step.

    python tests/benchmarks/gpu_overhead.py [--models small-llama llama-1b] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (
    StepTimer,
    environment,
    greedy_generate,
    median,
    print_table,
    timed_generate,
    write_json,
)
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model

MODES = ("none", "inferwatch", "sync-timing", "profiler")
TARGET_RATIO = {"small-llama": 0.98, "llama-1b": 0.99}


class SyncCounter:
    """Counts device synchronizations while active, from every thread."""

    _EXPLICIT = (
        (torch.cuda, "synchronize"),
        (torch.cuda.Event, "synchronize"),
        (torch.cuda.Stream, "synchronize"),
    )

    def __init__(self) -> None:
        self.explicit = 0
        self.implicit = 0
        self._lock = threading.Lock()

    def _counting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.explicit += 1
            return original(*args, **kwargs)

        return wrapper

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        originals = [(owner, name, getattr(owner, name)) for owner, name in self._EXPLICIT]
        for owner, name, original in originals:
            setattr(owner, name, self._counting(original))
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield
            self.implicit += sum("synchroniz" in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            for owner, name, original in originals:
                setattr(owner, name, original)


class Mode:
    """Puts a model into one measurement mode and takes it out again."""

    def __init__(self, model: torch.nn.Module, name: str, model_name: str) -> None:
        self.model, self.name, self.model_name = model, name, model_name

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        if self.name == "none":
            yield
        elif self.name == "inferwatch":
            handle = instrument(self.model, model_name=self.model_name, registry=CollectorRegistry())
            try:
                yield
            finally:
                handle.remove()
        elif self.name == "sync-timing":
            timer = StepTimer(self.model, synchronize=True)
            try:
                yield
            finally:
                timer.remove()
        elif self.name == "profiler":
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities):
                yield


def count_syncs(model: torch.nn.Module, mode: Mode, ids: torch.Tensor, new_tokens: int) -> SyncCounter:
    counter = SyncCounter()
    with mode.applied():
        timed_generate(model, ids, new_tokens)  # warm the mode (lazy allocations, first events)
        with counter.active():
            greedy_generate(model, ids, new_tokens)
        time.sleep(0.2)  # let a background resolver run while the counter is still installed
    return counter


def measure_model(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = build_model(name, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (args.batch, args.prompt_len), device="cuda")
    modes = [Mode(model, mode, name) for mode in MODES]
    for mode in modes:  # warm-up of each mode
        with mode.applied():
            timed_generate(model, ids, 8)
    ttft: dict[str, list[float]] = {m: [] for m in MODES}
    tps: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.repeats):
        order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
        for mode in order:
            with mode.applied():
                # Untimed first: a mode's set-up and the one before it (the profiler's teardown) must
                # not be charged to this measurement.
                timed_generate(model, ids, 4)
                ttft[mode.name].append(timed_generate(model, ids, 1))
                tps[mode.name].append(
                    args.batch * args.new_tokens / timed_generate(model, ids, args.new_tokens)
                )
    base_syncs = count_syncs(model, modes[0], ids, args.sync_tokens)
    rows = []
    for mode in modes:
        syncs = count_syncs(model, mode, ids, args.sync_tokens)
        rows.append(
            {
                "model": name,
                "mode": mode.name,
                "ttft_ms": median(ttft[mode.name]) * 1e3,
                "tokens_per_s": median(tps[mode.name]),
                # Paired: each repetition's run against the same repetition's uninstrumented one, a few
                # seconds apart, so drift of the host's speed over the run cancels.
                "ratio": median([a / b for a, b in zip(tps[mode.name], tps["none"], strict=True)]),
                "ttft_ratio": median([a / b for a, b in zip(ttft[mode.name], ttft["none"], strict=True)]),
                "added_explicit_syncs_per_step": (syncs.explicit - base_syncs.explicit) / args.sync_tokens,
                "added_implicit_syncs_per_step": (syncs.implicit - base_syncs.implicit) / args.sync_tokens,
            }
        )
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["small-llama", "llama-1b"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--sync-tokens", type=int, default=32, help="decode steps of the sync count")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the rows and environment to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_overhead: no CUDA device", file=sys.stderr)
        return 2
    rows = [row for name in args.models for row in measure_model(name, args)]
    env = environment()
    print(f"# gpu_overhead {env} batch={args.batch} prompt={args.prompt_len} new_tokens={args.new_tokens}")
    print_table(
        rows,
        [
            ("model", "model", str),
            ("mode", "mode", str),
            ("tokens_per_s", "decode tokens/s (median)", lambda v: f"{v:.1f}"),
            ("ratio", "vs none", lambda v: f"{v:.2%}"),
            ("ttft_ms", "TTFT ms (median)", lambda v: f"{v:.3f}"),
            ("ttft_ratio", "TTFT vs none", lambda v: f"{v:.3f}x"),
            ("added_explicit_syncs_per_step", "added explicit syncs/step", lambda v: f"{v:.2f}"),
            ("added_implicit_syncs_per_step", "added implicit syncs/step", lambda v: f"{v:.2f}"),
        ],
    )
    failures = [
        row
        for row in rows
        if row["mode"] == "inferwatch"
        and (
            row["ratio"] < TARGET_RATIO.get(row["model"], 0.98)
            or row["added_explicit_syncs_per_step"] > 0
            or row["added_implicit_syncs_per_step"] > 0
        )
    ]
    for row in failures:
        print(f"MISSED target: {row['model']} inferwatch at {row['ratio']:.2%} of uninstrumented")
    write_json(args.json, {"environment": env, "args": vars(args), "rows": rows})
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
