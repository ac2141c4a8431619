"""``inferwatch compare``: perplexity, speedup and verdict on real built-in models."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from inferwatch.bench.compare import perplexity, perturb_weights
from inferwatch.bench.texts import EVALUATION_TEXTS
from inferwatch.cli import main as cli_main
from inferwatch.instrumentation.demo.models import build_model, encode_text

FAST = ("--prompt-lens", "6,24", "--max-new-tokens", "4", "--repeats", "3", "--warmup", "1")


def compare(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = cli_main(["compare", *argv, *FAST, "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return code, json.loads(out)


def test_perplexity_agrees_with_the_models_own_loss() -> None:
    torch = pytest.importorskip("torch")
    model = build_model("tiny-gpt2")
    result = perplexity(model, EVALUATION_TEXTS, max_tokens=64)
    for name, text in EVALUATION_TEXTS:
        ids = torch.tensor([encode_text(text)[:64]])
        with torch.no_grad():
            loss = model(ids, labels=ids).loss  # transformers shifts the labels itself
        assert result.per_text[name] == pytest.approx(math.exp(float(loss)), rel=1e-5)
        assert result.predicted_tokens[name] == 63
    assert min(result.per_text.values()) <= result.corpus <= max(result.per_text.values())


def test_perturbation_is_seeded() -> None:
    first, second, other = build_model("tiny-llama"), build_model("tiny-llama"), build_model("tiny-llama")
    perturb_weights(first, 0.1, seed=3)
    perturb_weights(second, 0.1, seed=3)
    perturb_weights(other, 0.1, seed=4)
    pairs = list(zip(first.parameters(), second.parameters(), other.parameters(), strict=True))
    assert all(a.equal(b) for a, b, _ in pairs)
    assert not all(a.equal(c) for a, _, c in pairs)


def check_speedups(report: dict) -> None:
    """Speedup is the ratio of the median end-to-end latencies, pooled and per case."""
    base_runs = [[run["e2e_s"] for run in case["runs"]] for case in report["baseline"]["cases"]]
    cand_runs = [[run["e2e_s"] for run in case["runs"]] for case in report["candidate"]["cases"]]
    base_median = statistics.median(x for runs in base_runs for x in runs)
    cand_median = statistics.median(x for runs in cand_runs for x in runs)
    assert report["baseline"]["e2e_median_s"] == base_median
    assert report["candidate"]["e2e_median_s"] == cand_median
    assert report["speedup"] == pytest.approx(base_median / cand_median)
    for by_case, base, cand in zip(report["speedup_by_case"], base_runs, cand_runs, strict=True):
        assert by_case["speedup"] == pytest.approx(statistics.median(base) / statistics.median(cand))


def test_a_model_against_itself_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compare(capsys, "tiny-llama", "tiny-llama")
    assert code == 0
    assert report["verdict"] == "pass"
    assert report["perplexity_change"] == 0.0
    assert report["baseline"]["perplexity"] == report["candidate"]["perplexity"]
    assert len(report["baseline"]["cases"]) == len(report["candidate"]["cases"]) == 2
    for side in ("baseline", "candidate"):
        for case in report[side]["cases"]:
            assert [run["generated_tokens"] for run in case["runs"]] == [4, 4, 4]
    check_speedups(report)


def test_a_perturbed_candidate_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compare(capsys, "tiny-llama", "tiny-llama", "--candidate-perturb", "0.2")
    assert code == 1
    assert report["verdict"] == "fail"
    assert report["candidate"]["perturb_sigma"] == 0.2
    base, cand = report["baseline"]["perplexity"]["corpus"], report["candidate"]["perplexity"]["corpus"]
    assert report["perplexity_change"] == pytest.approx(cand / base - 1)
    assert report["perplexity_change"] > report["ppl_tolerance"]
    check_speedups(report)


def test_tolerance_decides_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compare(
        capsys, "tiny-llama", "tiny-llama", "--candidate-perturb", "0.2", "--ppl-tolerance", "100"
    )
    assert (code, report["verdict"]) == (0, "pass")


def test_a_saved_worse_model_fails_and_the_table_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    worse = build_model("tiny-llama")
    perturb_weights(worse, 0.2, seed=1)
    worse.save_pretrained(tmp_path / "worse")
    code = cli_main(["compare", "tiny-llama", str(tmp_path / "worse"), *FAST])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL: candidate perplexity is +" in out
    assert "beyond the tolerance of +2.00%" in out
    for name, _ in EVALUATION_TEXTS:
        assert name in out


def test_plot_is_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "latency.png"
    code, _ = compare(capsys, "tiny-llama", "tiny-gpt2", "--plot", str(plot))
    assert code in (0, 1)
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_unknown_candidate_fails_before_measuring(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["compare", "tiny-llama", "no-such-model"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert "unknown model 'no-such-model'" in err
