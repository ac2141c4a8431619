"""``inferwatch compare BASELINE CANDIDATE``: the regression test of the reference notes, as a command.

An optimization (quantization, compilation, a new attention kernel) is only a win when it is faster
without being worse. Both models are therefore measured on the same inputs:

* quality: perplexity on the bundled evaluation texts (:mod:`inferwatch.bench.texts`), byte-level encoded
  with ``encode_text`` and token-weighted across texts;
* speed: the benchmark of ``inferwatch bench`` (same prompts, same output lengths, same timing code),
  the two models' timed runs alternating within each case so that a drifting machine favours neither.

The speedup is the ratio of the median end-to-end latencies, baseline over candidate. The verdict fails,
and the command exits 1, when the candidate's perplexity is higher than the baseline's by more than
``--ppl-tolerance`` (relative): reference/000 expects a good weight quantization to lose "usually < 2 %".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from typing import Any

from inferwatch.bench.bench import (
    CaseResult,
    add_benchmark_arguments,
    benchmark_with_progress,
    environment,
    load_for_benchmark,
    resolve_device_dtype,
)
from inferwatch.bench.texts import EVALUATION_TEXTS

from .errors import ConfigError

DEFAULT_PPL_TOLERANCE = 0.02
# The notes' regression test truncates each text at 512 tokens.
DEFAULT_PPL_MAX_TOKENS = 512


@dataclass(frozen=True)
class Perplexity:
    """Perplexity per evaluation text and over all of them (the exponential of the mean token NLL)."""

    per_text: dict[str, float]
    predicted_tokens: dict[str, int]
    corpus: float

    def to_dict(self) -> dict[str, Any]:
        return {"corpus": self.corpus, "per_text": self.per_text, "predicted_tokens": self.predicted_tokens}


def perplexity(model: Any, texts: tuple[tuple[str, str], ...], max_tokens: int) -> Perplexity:
    """Teacher-forced perplexity of ``model`` on ``texts`` (each truncated to ``max_tokens`` tokens)."""
    import torch

    from inferwatch.instrumentation.demo.models import encode_text

    device = next(model.parameters()).device
    nll_sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    with torch.no_grad():
        for name, text in texts:
            ids = torch.tensor([encode_text(text)[:max_tokens]], device=device)
            logits = model(ids).logits.float()
            # Position i predicts token i + 1: the last logit has no target, the first token no prediction.
            nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
            nll_sums[name] = float(nll)
            counts[name] = ids.shape[1] - 1
    return Perplexity(
        per_text={name: math.exp(nll_sums[name] / counts[name]) for name in nll_sums},
        predicted_tokens=counts,
        corpus=math.exp(sum(nll_sums.values()) / sum(counts.values())),
    )


def perturb_weights(model: Any, sigma: float, seed: int) -> None:
    """Add Gaussian noise of standard deviation ``sigma`` to every weight, from a fixed ``seed``: a
    deliberately degraded candidate, reproducible on any device."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * sigma
            parameter.add_(noise.to(device=parameter.device, dtype=parameter.dtype))


def pooled_median_e2e(cases: list[CaseResult]) -> float:
    return statistics.median(x for case in cases for x in case.e2e_s)


@dataclass
class Side:
    """Everything measured for one of the two models."""

    spec: str
    environment: dict[str, Any]
    perplexity: Perplexity
    cases: list[CaseResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.spec,
            **self.environment,
            "perplexity": self.perplexity.to_dict(),
            "e2e_median_s": pooled_median_e2e(self.cases),
            "cases": [case.to_dict() for case in self.cases],
        }


def build_report(baseline: Side, candidate: Side, args: argparse.Namespace) -> dict[str, Any]:
    """The comparison as plain data: the ``--json`` output and the source of the tables."""
    change = candidate.perplexity.corpus / baseline.perplexity.corpus - 1.0
    return {
        "baseline": baseline.to_dict(),
        "candidate": {**candidate.to_dict(), "perturb_sigma": args.candidate_perturb},
        "perplexity_change": change,
        "ppl_tolerance": args.ppl_tolerance,
        "speedup": pooled_median_e2e(baseline.cases) / pooled_median_e2e(candidate.cases),
        "speedup_by_case": [
            {
                "prompt_tokens": base.prompt_tokens,
                "max_new_tokens": base.max_new_tokens,
                "speedup": statistics.median(base.e2e_s) / statistics.median(cand.e2e_s),
            }
            for base, cand in zip(baseline.cases, candidate.cases, strict=True)
        ],
        "verdict": "pass" if change <= args.ppl_tolerance else "fail",
    }


def import_pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; ConfigError when matplotlib is not installed
    (it is an optional dependency, in the ``dev`` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'inferwatch[dev]' or matplotlib") from None
    matplotlib.use("Agg")  # no display is needed; must precede the pyplot import
    from matplotlib import pyplot

    return pyplot


def write_plot(pyplot: Any, baseline: Side, candidate: Side, path: str) -> None:
    """A PNG of the end-to-end latency distributions of both models, side by side per case."""
    figure, axes = pyplot.subplots(figsize=(max(6.0, 1.6 * len(baseline.cases) + 2), 4.5))
    ticks, labels = [], []
    for index, (base, cand) in enumerate(zip(baseline.cases, candidate.cases, strict=True)):
        center = index * 3.0
        for offset, case, color in ((-0.5, base, "tab:blue"), (0.5, cand, "tab:orange")):
            axes.boxplot(
                [x * 1e3 for x in case.e2e_s],
                positions=[center + offset],
                widths=0.8,
                patch_artist=True,
                boxprops={"facecolor": color, "alpha": 0.6},
                medianprops={"color": "black"},
            )
        ticks.append(center)
        labels.append(f"{base.prompt_tokens} in / {base.max_new_tokens} out")
    axes.set_xticks(ticks, labels)
    axes.set_ylabel("end-to-end latency (ms)")
    axes.set_title(f"baseline {baseline.spec} (blue) vs candidate {candidate.spec} (orange)")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def print_report(report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    base, cand = report["baseline"], report["candidate"]
    quality = Table(title="perplexity (bundled texts, byte-level)", box=box.SIMPLE_HEAD)
    for header in ("text", "tokens", "baseline", "candidate", "change"):
        quality.add_column(header, justify="left" if header == "text" else "right")
    rows = [(name, base["perplexity"]["predicted_tokens"][name]) for name in base["perplexity"]["per_text"]]
    for name, tokens in rows:
        before, after = base["perplexity"]["per_text"][name], cand["perplexity"]["per_text"][name]
        quality.add_row(name, str(tokens), f"{before:.3f}", f"{after:.3f}", f"{after / before - 1:+.2%}")
    quality.add_row(
        "all",
        str(sum(tokens for _, tokens in rows)),
        f"{base['perplexity']['corpus']:.3f}",
        f"{cand['perplexity']['corpus']:.3f}",
        f"{report['perplexity_change']:+.2%}",
        style="bold",
    )
    console.print(quality)

    speed = Table(title="end-to-end latency, median (ms)", box=box.SIMPLE_HEAD)
    for header in ("prompt", "new", "baseline", "candidate", "speedup"):
        speed.add_column(header, justify="right")
    for by_case, base_case, cand_case in zip(
        report["speedup_by_case"], base["cases"], cand["cases"], strict=True
    ):
        speed.add_row(
            str(by_case["prompt_tokens"]),
            str(by_case["max_new_tokens"]),
            f"{base_case['e2e_s']['median'] * 1e3:.2f}",
            f"{cand_case['e2e_s']['median'] * 1e3:.2f}",
            f"{by_case['speedup']:.2f}x",
        )
    speed.add_row(
        "all",
        "",
        f"{base['e2e_median_s'] * 1e3:.2f}",
        f"{cand['e2e_median_s'] * 1e3:.2f}",
        f"{report['speedup']:.2f}x",
        style="bold",
    )
    console.print(speed)

    change, tolerance = report["perplexity_change"], report["ppl_tolerance"]
    if report["verdict"] == "pass":
        verdict = (
            f"[green]PASS[/]: perplexity {change:+.2%} (tolerance +{tolerance:.2%}), "
            f"speedup {report['speedup']:.2f}x"
        )
    else:
        verdict = (
            f"[red]FAIL[/]: candidate perplexity is {change:+.2%} against the baseline, beyond the "
            f"tolerance of +{tolerance:.2%}"
        )
    # One line however narrow the terminal: scripts grep for it.
    console.print(verdict, soft_wrap=True)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", help="the reference model: built-in name or save_pretrained() directory")
    parser.add_argument(
        "candidate", help="the model under test: built-in name or save_pretrained() directory"
    )
    add_benchmark_arguments(parser)
    parser.add_argument(
        "--ppl-tolerance",
        type=_non_negative_float,
        default=DEFAULT_PPL_TOLERANCE,
        help=f"largest relative perplexity increase that passes (default {DEFAULT_PPL_TOLERANCE})",
    )
    parser.add_argument(
        "--ppl-max-tokens",
        type=int,
        default=DEFAULT_PPL_MAX_TOKENS,
        help=f"truncate each evaluation text to this many tokens (default {DEFAULT_PPL_MAX_TOKENS})",
    )
    parser.add_argument(
        "--candidate-perturb",
        type=_non_negative_float,
        default=0.0,
        metavar="SIGMA",
        help="add Gaussian noise of this standard deviation to the candidate's weights (a degraded control)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --candidate-perturb's noise (default 0)")
    parser.add_argument("--plot", metavar="PNG", help="write latency distributions side by side to this file")


def main(args: argparse.Namespace) -> int:
    if args.ppl_max_tokens < 2:
        raise ConfigError("--ppl-max-tokens must be at least 2 (a prediction needs a context and a target)")
    # Every input is checked (models found, matplotlib present) before minutes of measuring, not after.
    pyplot = import_pyplot() if args.plot else None
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    specs = (args.baseline, args.candidate)
    models = [load_for_benchmark(spec, device, dtype) for spec in specs]
    if args.candidate_perturb:
        perturb_weights(models[1], args.candidate_perturb, args.seed)
    timings = benchmark_with_progress(models, " vs ".join(specs), args)
    baseline, candidate = (
        Side(spec, environment(model), perplexity(model, EVALUATION_TEXTS, args.ppl_max_tokens), cases)
        for spec, model, cases in zip(specs, models, timings, strict=True)
    )
    report = build_report(baseline, candidate, args)
    if pyplot is not None:
        write_plot(pyplot, baseline, candidate, args.plot)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(report)
    return 0 if report["verdict"] == "pass" else 1
