"""Shared pieces of the benchmark scripts: a fixed-length greedy generate, per-step timers hooked on a
model, and reading per-request figures back from inferwatch's own histograms.

The scripts run as plain programs (``python tests/benchmarks/gpu_accuracy.py``) on the GPU machine, so
this module is imported by path, not as part of the test suite.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from prometheus_client import CollectorRegistry


@dataclass
class StepTimes:
    """Host timestamps (perf_counter) of the end of each forward of one ``generate`` call."""

    start: float = 0.0
    ends: list[float] = field(default_factory=list)

    def ttft(self) -> float:
        return self.ends[0] - self.start

    def mean_itl(self) -> float:
        return (self.ends[-1] - self.ends[0]) / (len(self.ends) - 1)


class StepTimer:
    """Timestamps every forward's end with ``time.perf_counter``.

    ``synchronize=True`` is the reference notes' correct method (``torch.cuda.synchronize()`` then the
    clock) and serves as ground truth; ``synchronize=False`` is the naive host-clock method, which reads
    the time the kernels were *launched*. A forward hook registered after inferwatch's runs after it, so
    inferwatch's end-of-forward event is already enqueued when the ground-truth sync drains the stream.
    """

    def __init__(self, model: torch.nn.Module, *, synchronize: bool) -> None:
        self.times = StepTimes()
        self._synchronize = synchronize
        self._handle = model.register_forward_hook(self._on_forward_end)

    def _on_forward_end(self, module: Any, args: Any, output: Any) -> None:
        if self._synchronize:
            torch.cuda.synchronize()
        self.times.ends.append(time.perf_counter())

    def begin(self) -> None:
        """Call right before ``generate``: the request's start on the host clock."""
        self.times = StepTimes(start=time.perf_counter())

    def remove(self) -> None:
        self._handle.remove()


def greedy_generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Exactly ``new_tokens`` greedy tokens per row (EOS cannot end a benchmark request early).

    ``attention_mask`` defaults to all ones, made here; a caller timing the call passes one made before.
    Other keyword arguments go to ``generate`` (``stopping_criteria=`` for a ground truth).
    """
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids) if attention_mask is None else attention_mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            **kwargs,
        )


def static_cache(device: str) -> dict[str, Any]:
    """generate's arguments for its compiled decode path: a static cache, and on the CPU dynamo's eager
    backend (no C compiler), which transformers uses only when told to compile on every device."""
    if device == "cuda":
        return {"cache_implementation": "static"}
    from transformers.generation.configuration_utils import CompileConfig

    compile_config = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    return {"cache_implementation": "static", "compile_config": compile_config}


def timed_generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, **kwargs: Any) -> float:
    """Wall time of :func:`greedy_generate` (``kwargs`` go to it), the device drained before and after
    (outside the request)."""
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    greedy_generate(model, ids, new_tokens, **kwargs)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def registry_sum(registry: CollectorRegistry, sample_name: str) -> float:
    """Sum of every sample called ``sample_name`` across label sets."""
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == sample_name
    )


class HistogramDelta:
    """Mean of the observations a histogram received since :meth:`mark`, waiting for the asynchronous
    resolver to deliver them (inferwatch resolves CUDA events off the hot path)."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self._registry = registry
        self._name = name
        self._sum = self._count = 0.0

    def mark(self) -> None:
        self._sum = registry_sum(self._registry, self._name + "_sum")
        self._count = registry_sum(self._registry, self._name + "_count")

    def mean_since_mark(self, expected_count: int = 1, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            count = registry_sum(self._registry, self._name + "_count") - self._count
            if count >= expected_count or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if count <= 0:
            raise TimeoutError(f"{self._name} received no observation within {timeout}s")
        return (registry_sum(self._registry, self._name + "_sum") - self._sum) / count


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratios(ratios: list[float], resamples: int = 10_000) -> dict[str, Any]:
    """Per-pair ratios (instrumented / bare) summarised: median, mean, spread, and the 95 % bootstrap
    confidence interval of the median (seeded: the same ratios give the same interval)."""
    generator = random.Random(0)
    medians = sorted(statistics.median(generator.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return {
        "pairs": len(ratios),
        "ratio_median": statistics.median(ratios),
        "ratio_mean": statistics.fmean(ratios),
        "ratio_ci95": [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]],
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratios": ratios,
    }


#: :func:`print_table` columns for a row holding :func:`paired_ratios`' summary.
PAIRED_RATIO_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("ratio_median", "ratio (median)", lambda v: f"{v:.2%}"),
    ("ratio_ci95", "95 % CI", lambda v: f"{v[0]:.2%}-{v[1]:.2%}"),
    ("ratio_min", "min", lambda v: f"{v:.2%}"),
    ("ratio_max", "max", lambda v: f"{v:.2%}"),
]


def environment() -> dict[str, Any]:
    """What the figures were measured on: GPU, driver, versions."""
    import transformers

    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as exc:  # the figures stand without the driver version
        info["driver"] = f"unknown ({exc.__class__.__name__})"
    return info


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Callable[[Any], str]]]) -> None:
    """Print ``rows`` as a Markdown table: (key, heading, formatter) per column."""
    print("| " + " | ".join(h for _, h, _ in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(fmt(row[key]) for key, _, fmt in columns) + " |")


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
