"""``inferwatch bench`` on real built-in models: the JSON report is internally consistent."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from inferwatch.bench.bench import prompt_ids
from inferwatch.cli import main as cli_main
from inferwatch.instrumentation.demo.models import build_model


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def bench_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = run_cli(capsys, "bench", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_prompt_ids_have_the_requested_length_and_are_bytes() -> None:
    for length in (1, 7, 5000):
        ids = prompt_ids(length)
        assert len(ids) == length
        assert all(0 <= token < 256 for token in ids)
    assert prompt_ids(10) == prompt_ids(20)[:10]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_bench_json_is_consistent(capsys: pytest.CaptureFixture[str], model: str) -> None:
    report = bench_json(
        capsys, model, "--prompt-lens", "5,40", "--max-new-tokens", "1,6", "--repeats", "3", "--warmup", "1"
    )
    assert report["model"] == model
    assert report["device"] == "cpu" and report["dtype"] == "float32"
    assert report["parameters"] == sum(p.numel() for p in build_model(model).parameters())
    cases = report["cases"]
    assert [(c["prompt_tokens"], c["max_new_tokens"]) for c in cases] == [(5, 1), (5, 6), (40, 1), (40, 6)]
    for case in cases:
        runs = case["runs"]
        assert len(runs) == 3
        for run in runs:
            assert run["prompt_tokens"] == case["prompt_tokens"]
            assert run["generated_tokens"] == case["max_new_tokens"]
            assert len(run["token_latencies_s"]) == run["generated_tokens"] - 1
            assert 0 < run["ttft_s"] < run["e2e_s"]
            assert run["ttft_s"] + run["decode_s"] == pytest.approx(run["e2e_s"])
            # Decode is the token intervals plus the tail of generate after the last token.
            assert sum(run["token_latencies_s"]) <= run["decode_s"]
        generated = sum(run["generated_tokens"] for run in runs)
        assert case["tokens_per_s"] == pytest.approx(generated / sum(run["e2e_s"] for run in runs))
        assert case["prefill_share"] == pytest.approx(
            sum(run["ttft_s"] for run in runs) / sum(run["e2e_s"] for run in runs)
        )
        assert case["ttft_s"]["median"] == statistics.median(run["ttft_s"] for run in runs)
        intervals = [x for run in runs for x in run["token_latencies_s"]]
        assert case["inter_token_latency_s"]["count"] == len(intervals)
        if intervals:
            assert case["inter_token_latency_s"]["median"] == statistics.median(intervals)
        else:
            assert case["inter_token_latency_s"]["median"] is None
    all_e2e = [run["e2e_s"] for case in cases for run in case["runs"]]
    assert report["e2e_s"]["median"] == statistics.median(all_e2e)


def test_bench_of_a_saved_model_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    build_model("tiny-llama").save_pretrained(tmp_path / "saved")
    report = bench_json(
        capsys, str(tmp_path / "saved"), "--prompt-lens", "8", "--max-new-tokens", "3", "--repeats", "1"
    )
    assert report["cases"][0]["runs"][0]["generated_tokens"] == 3


def test_bench_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "bench", "tiny-llama", "--prompt-lens", "8,16", "--max-new-tokens", "4", "--repeats", "2"
    )
    assert code == 0
    assert "tiny-llama on cpu (float32" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["8", "4"], ["16", "4"])]
    assert len(rows) == 2
    assert "\x1b[" not in out  # not a terminal: no colour codes


def test_bench_json_without_rich(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `import rich.progress` fail as on a machine without the monitor extra.
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    report = bench_json(capsys, "tiny-llama", "--prompt-lens", "8", "--max-new-tokens", "2", "--repeats", "1")
    assert report["cases"][0]["runs"][0]["generated_tokens"] == 2


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "no-such-model")
    assert code == 2
    assert out == ""
    assert "unknown model 'no-such-model'" in err and "tiny-llama" in err


@pytest.mark.parametrize(
    "flags",
    [["--prompt-lens", "0"], ["--prompt-lens", "a,b"], ["--repeats", "0"], ["--warmup", "-1"]],
)
def test_bad_numbers_are_rejected_by_the_parser(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "tiny-llama", *flags])
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_cuda_device_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_cli(capsys, "bench", "tiny-llama", "--device", "cuda")
    assert code == 2
    assert "CUDA is not available" in err


@pytest.mark.gpu
def test_bench_on_cuda_is_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    report = bench_json(
        capsys,
        "small-llama",
        "--device",
        "cuda",
        "--prompt-lens",
        "64",
        "--max-new-tokens",
        "16",
        "--repeats",
        "3",
    )
    assert report["device"].startswith("cuda") and report["dtype"] == "bfloat16"
    for run in report["cases"][0]["runs"]:
        assert run["generated_tokens"] == 16
        assert 0 < run["ttft_s"] < run["e2e_s"]
        assert sum(run["token_latencies_s"]) <= run["decode_s"]
