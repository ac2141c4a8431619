"""``inferwatch bench MODEL``: the benchmark of the reference notes, as a command.

For every pair of prompt length and output length the model is warmed up, then ``generate`` is timed
``repeats`` times with the notes' method: the device is synchronized before every clock reading
(:class:`~inferwatch.bench.timing.DeviceClock`). A stopping criterion, which ``generate`` calls once per
new token, reads the clock at each token, so a single run yields:

* TTFT (time to first token): entry into ``generate`` until the first new token exists. This is the
  prefill phase (the forward over the whole prompt) plus ``generate``'s own set-up and first sampling.
* the inter-token latencies of every later token, whose sum is the decode phase;
* end-to-end latency and tokens/s.

Greedy decoding with ``min_new_tokens == max_new_tokens`` makes every run produce exactly the requested
number of tokens, so runs are comparable and two models can be compared token for token.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from inferwatch.bench.texts import EVALUATION_TEXTS
from inferwatch.bench.timing import DeviceClock, summarize

from .errors import ConfigError

DEFAULT_PROMPT_LENS = (32, 128, 512)
DEFAULT_MAX_NEW_TOKENS = (64,)
DTYPES = ("auto", "float32", "float16", "bfloat16")
# The notes warm up with short generations: enough to compile kernels and fill allocator caches.
WARMUP_MAX_NEW_TOKENS = 16


@dataclass(frozen=True)
class RunTiming:
    """One timed ``generate`` call."""

    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    e2e_s: float
    # Intervals between consecutive new tokens: generated_tokens - 1 of them.
    token_latencies_s: tuple[float, ...]

    @property
    def decode_s(self) -> float:
        return self.e2e_s - self.ttft_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "e2e_s": self.e2e_s,
            "token_latencies_s": list(self.token_latencies_s),
        }


@dataclass
class CaseResult:
    """All timed runs of one (prompt length, output length) case."""

    prompt_tokens: int
    max_new_tokens: int
    runs: list[RunTiming] = field(default_factory=list)

    @property
    def e2e_s(self) -> list[float]:
        return [run.e2e_s for run in self.runs]

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over wall time, prefill included: what a client of one request sees."""
        return sum(run.generated_tokens for run in self.runs) / sum(self.e2e_s)

    @property
    def prefill_share(self) -> float:
        """Fraction of end-to-end time spent before the first token (reference/000's time breakdown)."""
        return sum(run.ttft_s for run in self.runs) / sum(self.e2e_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens,
            "ttft_s": summarize([run.ttft_s for run in self.runs]),
            "inter_token_latency_s": summarize([x for run in self.runs for x in run.token_latencies_s]),
            "decode_s": summarize([run.decode_s for run in self.runs]),
            "e2e_s": summarize(self.e2e_s),
            "tokens_per_s": self.tokens_per_s,
            "prefill_share": self.prefill_share,
            "runs": [run.to_dict() for run in self.runs],
        }


def prompt_ids(length: int) -> list[int]:
    """A prompt of exactly ``length`` byte-level tokens: the bundled texts run together, repeated as
    needed. Byte ids (< 256) are valid for every built-in vocabulary and any model with >= 256 tokens."""
    if length < 1:
        raise ValueError("a prompt has at least one token")
    corpus = "\n\n".join(text for _, text in EVALUATION_TEXTS).encode("utf-8")
    repeated = corpus * (length // len(corpus) + 1)
    return list(repeated[:length])


class _TokenClock:
    """A stopping criterion that never stops and records a synchronized timestamp each time ``generate``
    has appended a token. ``generate`` only calls its criteria, so no ``transformers`` base class (and no
    import of transformers at module load) is needed."""

    def __init__(self, clock: DeviceClock) -> None:
        self._clock = clock
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.stamps.append(self._clock.now())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def timed_generate(model: Any, input_ids: Any, max_new_tokens: int, clock: DeviceClock) -> RunTiming:
    """Greedy ``generate`` of exactly ``max_new_tokens`` tokens, timed per token."""
    import torch
    from transformers import StoppingCriteriaList

    recorder = _TokenClock(clock)
    pad_token_id = model.generation_config.pad_token_id
    if pad_token_id is None:
        pad_token_id = model.generation_config.eos_token_id
    if isinstance(pad_token_id, list):  # several EOS ids: any of them pads
        pad_token_id = pad_token_id[0]
    with torch.no_grad():
        start = clock.now()
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
            stopping_criteria=StoppingCriteriaList([recorder]),
        )
        end = clock.now()
    stamps = recorder.stamps
    return RunTiming(
        prompt_tokens=int(input_ids.shape[1]),
        generated_tokens=int(output.shape[1] - input_ids.shape[1]),
        ttft_s=stamps[0] - start,
        e2e_s=end - start,
        token_latencies_s=tuple(later - earlier for earlier, later in itertools.pairwise(stamps)),
    )


def run_benchmark(
    models: Sequence[Any],
    *,
    prompt_lens: Sequence[int],
    max_new_tokens: Sequence[int],
    repeats: int,
    warmup: int,
    on_generate: Callable[[], None] = lambda: None,
) -> list[list[CaseResult]]:
    """Benchmark each model (already on its device) on every (prompt length, output length) case; one
    list of cases per model. With several models the timed runs of a case alternate between them, so a
    drift of the machine (clocks, temperature, other load) falls on all of them alike rather than on
    whichever ran last. ``on_generate`` is called after each ``generate``, warm-ups included."""
    import torch

    devices = [next(model.parameters()).device for model in models]
    clocks = [DeviceClock(device) for device in devices]
    results: list[list[CaseResult]] = [[] for _ in models]
    for prompt_len in prompt_lens:
        inputs = [torch.tensor([prompt_ids(prompt_len)], device=device) for device in devices]
        for new_tokens in max_new_tokens:
            for model, input_ids, clock in zip(models, inputs, clocks, strict=True):
                for _ in range(warmup):
                    timed_generate(model, input_ids, min(WARMUP_MAX_NEW_TOKENS, new_tokens), clock)
                    on_generate()
            cases = [CaseResult(prompt_len, new_tokens) for _ in models]
            for _ in range(repeats):
                for model, input_ids, clock, case in zip(models, inputs, clocks, cases, strict=True):
                    case.runs.append(timed_generate(model, input_ids, new_tokens, clock))
                    on_generate()
            for per_model, case in zip(results, cases, strict=True):
                per_model.append(case)
    return results


# --- command line (shared with `inferwatch compare`) ---------------------------------------------------


def positive_int_list(text: str) -> list[int]:
    """argparse type: a comma-separated list of positive integers."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def add_benchmark_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the benchmark itself, common to ``bench`` and ``compare``."""
    parser.add_argument("--device", default="auto", help="torch device; auto: cuda when usable, else cpu")
    parser.add_argument(
        "--dtype", default="auto", choices=DTYPES, help="weights dtype; auto: bfloat16 on cuda, else float32"
    )
    parser.add_argument(
        "--prompt-lens",
        type=positive_int_list,
        default=list(DEFAULT_PROMPT_LENS),
        metavar="N,N,...",
        help=f"prompt lengths in tokens (default {','.join(map(str, DEFAULT_PROMPT_LENS))})",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int_list,
        default=list(DEFAULT_MAX_NEW_TOKENS),
        metavar="N,N,...",
        help=f"output lengths in tokens (default {','.join(map(str, DEFAULT_MAX_NEW_TOKENS))})",
    )
    parser.add_argument(
        "--repeats", type=_int_at_least(1), default=5, metavar="N", help="timed runs per case (default 5)"
    )
    parser.add_argument(
        "--warmup", type=_int_at_least(0), default=2, metavar="N", help="untimed runs per case (default 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")


def resolve_device_dtype(device: str, dtype: str) -> tuple[Any, Any]:
    """The torch device and dtype of ``--device``/``--dtype``; ConfigError when unusable here."""
    import torch

    from inferwatch.instrumentation.demo.models import default_device

    try:
        torch_device = torch.device(default_device() if device == "auto" else device)
    except RuntimeError as exc:
        raise ConfigError(f"bad --device {device!r}: {exc}") from None
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine")
    if dtype == "auto":
        return torch_device, torch.bfloat16 if torch_device.type == "cuda" else torch.float32
    return torch_device, getattr(torch, dtype)


def load_for_benchmark(spec: str, device: Any, dtype: Any, *, seed: int = 0) -> Any:
    """A built-in or locally saved model on ``device`` in ``dtype``; ConfigError for an unknown spec."""
    from inferwatch.instrumentation.demo.models import UnknownModelError, load_model

    try:
        return load_model(spec, device=str(device), dtype=dtype, seed=seed)
    except UnknownModelError as exc:
        raise ConfigError(str(exc)) from None


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar on stderr, shown only when stderr is a terminal; yields the advance callback."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        # A machine with torch but without the monitor extra (a bare GPU box) still benchmarks, as --json.
        yield lambda: None
        return

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def benchmark_with_progress(
    models: Sequence[Any], label: str, args: argparse.Namespace
) -> list[list[CaseResult]]:
    """:func:`run_benchmark` with the command-line settings in ``args`` and a progress bar."""
    generates = len(models) * len(args.prompt_lens) * len(args.max_new_tokens) * (args.warmup + args.repeats)
    with progress_bar(label, generates) as advance:
        return run_benchmark(
            models,
            prompt_lens=args.prompt_lens,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            warmup=args.warmup,
            on_generate=advance,
        )


def environment(model: Any) -> dict[str, Any]:
    """Where the figures were measured: reported with every result so that it can be reproduced."""
    import os
    import platform

    import torch
    import transformers

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    return {
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"{os.cpu_count()} CPU cores ({platform.machine()})"
        ),
        "dtype": str(dtype).removeprefix("torch."),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def render_table(cases: Sequence[CaseResult], title: str) -> Any:
    """A rich table of the per-case figures (milliseconds)."""
    from rich import box
    from rich.table import Table

    # No vertical rules: the table then fits an 80-column terminal or a log file unwrapped.
    table = Table(title=title, box=box.SIMPLE_HEAD)
    headers = ("prompt", "new", "TTFT", "ITL", "ITL p90", "e2e", "tok/s", "prefill", "decode")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    for case in cases:
        summary = case.to_dict()
        table.add_row(
            str(case.prompt_tokens),
            str(case.max_new_tokens),
            _ms(summary["ttft_s"]["median"]),
            _ms(summary["inter_token_latency_s"]["median"]),
            _ms(summary["inter_token_latency_s"]["p90"]),
            _ms(summary["e2e_s"]["median"]),
            f"{case.tokens_per_s:.1f}",
            f"{case.prefill_share:.1%}",
            f"{1 - case.prefill_share:.1%}",
        )
    table.caption = (
        "latencies in ms, medians unless marked; prefill/decode: share of end-to-end time before/after "
        "the first token"
    )
    return table


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", help="a built-in model name (e.g. tiny-llama) or a save_pretrained() directory"
    )
    add_benchmark_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    device, dtype = resolve_device_dtype(args.device, args.dtype)
    model = load_for_benchmark(args.model, device, dtype)
    (cases,) = benchmark_with_progress([model], args.model, args)
    if args.json:
        report = {
            "model": args.model,
            **environment(model),
            "warmup": args.warmup,
            "repeats": args.repeats,
            "e2e_s": summarize([x for case in cases for x in case.e2e_s]),
            "cases": [case.to_dict() for case in cases],
        }
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        env = environment(model)
        title = f"{args.model} on {env['device']} ({env['dtype']}, {env['parameters']:,} parameters)"
        Console().print(render_table(cases, title))
    return 0
