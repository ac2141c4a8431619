"""``inferwatch demo`` in-process: bad options exit 2 before any model loads; the request stream and the
summary's percentiles (the demo as a real process: tests/integration/serving/test_demo_process.py)."""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence

import pytest
import torch

from inferwatch.cli import main as inferwatch
from inferwatch.instrumentation.demo.command import RequestStream
from inferwatch.instrumentation.demo.summary import histogram_quantile


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model=gpt-5"], "--model: unknown model 'gpt-5'"),
        (["--port=-1"], "--port: port must be an integer in 0..65535, got -1"),
        (["--prompt-len-range", "9", "3"], "--prompt-len-range: need 1 <= MIN <= MAX, got 9 3"),
        (["--max-new-tokens=0"], "--max-new-tokens: must be >= 1, got 0"),
        (["--concurrency=0"], "--concurrency: must be >= 1, got 0"),
        (["--duration=0"], "--duration: must be a finite number > 0, got 0.0"),
        (["--step-sleep=-1"], "--step-sleep: must be a finite number >= 0, got -1.0"),
    ],
)
def test_bad_arguments_exit_2(arguments: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert inferwatch(["demo", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_bad_instrumentation_variable_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("INFERWATCH_TTFT_BUCKETS", "0.5,0.1")
    assert inferwatch(["demo", "--model=tiny-llama"]) == 2
    assert "INFERWATCH_TTFT_BUCKETS='0.5,0.1'" in capsys.readouterr().err


def test_unknown_option_exits_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        inferwatch(["demo", "--device=tpu"])
    assert exit_.value.code == 2
    assert "--device: invalid choice: 'tpu'" in capsys.readouterr().err


def test_taken_port_exits_2(port: int, capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert inferwatch(["demo", "--model=tiny-llama", f"--port={port}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"inferwatch demo: cannot serve metrics on 127.0.0.1:{port}: the address is already in use; "
        "pick another port with --port"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert inferwatch(["demo", "--model=tiny-llama", "--device=cuda"]) == 2
    assert "--device cuda: no usable CUDA device" in capsys.readouterr().err


def test_request_stream_mixes_shapes_and_decoding_and_is_reproducible() -> None:
    def draws(seed: int) -> Sequence:
        stream = RequestStream(seed, (4, 24), 16)
        return [stream.next() for _ in range(400)]

    requests = [request for request, _ in draws(3)]
    assert draws(3) == draws(3) != draws(4)
    assert {r.batch_size for r in requests} == {1, 2, 3, 4}
    assert {r.do_sample for r in requests} == {True, False}
    assert {r.prompt_len for r in requests} == set(range(4, 25))
    assert {r.max_new_tokens for r in requests} == set(range(4, 17))


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 2.0), (0.2, 6.0), (math.inf, 8.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 4: halfway through (0.1, 0.2]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)  # rank 2: the top of the first bucket
    assert histogram_quantile(0.95, buckets) == 0.2  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
