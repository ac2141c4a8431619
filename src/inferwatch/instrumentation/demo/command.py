"""``inferwatch demo``: a small built-in model serving a stream of requests, instrumented, on localhost.

It builds a model from a config (nothing downloaded; on the GPU when there is one), instruments it with
:func:`~inferwatch.instrumentation.instrument`, serves the metrics over HTTP and keeps ``--concurrency``
threads generating: prompts of random token ids with lengths in ``--prompt-len-range``, output lengths
up to ``--max-new-tokens``, some requests batched, some sampled and some greedy, all drawn from one
seeded generator so two runs with the same ``--seed`` send the same requests. Every few seconds it prints
a line computed from its own metrics, the way Prometheus would see them: TTFT p50/p95 over the last
window, generated tokens per second, KV-cache bytes held now.

``--step-sleep`` and ``--request-interval`` shape the load for experiments (and for the tests of the
alerts and dashboards): a host-side sleep in every decode step makes the loop host-bound (the GPU idles
between steps), an idle time between requests makes the traffic sparse.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY

from inferwatch.instrumentation.config import ConfigError, InstrumentConfig
from inferwatch.instrumentation.demo.models import BOS_TOKEN_ID, BUILTIN_MODELS, default_device
from inferwatch.instrumentation.demo.summary import LiveSummary
from inferwatch.instrumentation.endpoint.server import (
    DEFAULT_ADDRESS,
    DEFAULT_PORT,
    ListenError,
    start_http_server,
    validate_port,
)
from inferwatch.instrumentation.launcher.command import check_endpoint_environment, with_flag_hint

DEFAULT_MODEL = "small-llama"

#: Fraction of requests that carry several sequences, and the batch sizes they draw from.
BATCHED_REQUEST_SHARE = 0.25
BATCH_SIZES = (2, 3, 4)
#: Fraction of requests that sample (temperature, top-k) instead of decoding greedily.
SAMPLED_REQUEST_SHARE = 0.5


@dataclass(frozen=True)
class DemoRequest:
    """One ``generate`` call of the demo's stream."""

    batch_size: int
    prompt_len: int
    max_new_tokens: int
    do_sample: bool


WARM_UP_REQUEST = DemoRequest(batch_size=1, prompt_len=8, max_new_tokens=2, do_sample=False)


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError, ListenError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a built-in model ({', '.join(BUILTIN_MODELS)}) or a save_pretrained directory "
        f"(default {DEFAULT_MODEL})",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"metrics port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--addr", default=DEFAULT_ADDRESS, help=f"metrics address (default {DEFAULT_ADDRESS})"
    )
    parser.add_argument("--model-name", metavar="NAME", help="value of the `model` label (default: --model)")
    parser.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: never)"
    )
    parser.add_argument("--concurrency", type=int, default=1, metavar="N", help="request threads (default 1)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, metavar="N", help="longest output of a request (default 64)"
    )
    parser.add_argument(
        "--prompt-len-range",
        type=int,
        nargs=2,
        default=(8, 128),
        metavar=("MIN", "MAX"),
        help="prompt lengths in tokens (default 8 128)",
    )
    parser.add_argument(
        "--request-interval", type=float, default=0.0, metavar="SECONDS", help="idle time between requests"
    )
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="host-side sleep in every decode step: a deliberately host-bound serving loop",
    )
    parser.add_argument(
        "--summary-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="live summary period (default 5)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weights and the requests (default 0)"
    )


class RequestStream:
    """The demo's requests, drawn from one seeded generator (thread-safe)."""

    def __init__(self, seed: int, prompt_len_range: tuple[int, int], max_new_tokens: int) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._prompt_len_range = prompt_len_range
        # Outputs vary from a quarter of the maximum up to it, so short and long requests mix.
        self._new_tokens_range = (max(1, max_new_tokens // 4), max_new_tokens)

    def next(self) -> tuple[DemoRequest, int]:
        """The next request and a seed for its prompt's token ids and its sampling."""
        with self._lock:
            rand = self._random
            batched = rand.random() < BATCHED_REQUEST_SHARE
            request = DemoRequest(
                batch_size=rand.choice(BATCH_SIZES) if batched else 1,
                prompt_len=rand.randint(*self._prompt_len_range),
                max_new_tokens=rand.randint(*self._new_tokens_range),
                do_sample=rand.random() < SAMPLED_REQUEST_SHARE,
            )
            return request, rand.getrandbits(63)


def _validate(args: argparse.Namespace) -> None:
    try:
        validate_port(args.port)
    except ValueError as exc:
        raise ConfigError(f"--port: {exc}") from None
    check_endpoint_environment(os.environ, program=False)
    if args.model not in BUILTIN_MODELS and not os.path.isdir(args.model):
        raise ConfigError(
            f"--model: unknown model {args.model!r}: not a directory, and built-in models are "
            f"{', '.join(BUILTIN_MODELS)}"
        )
    if args.model not in BUILTIN_MODELS and not os.path.isfile(os.path.join(args.model, "config.json")):
        raise ConfigError(f"--model: {args.model!r} has no config.json: not a save_pretrained directory")
    low, high = args.prompt_len_range
    if not 1 <= low <= high:
        raise ConfigError(f"--prompt-len-range: need 1 <= MIN <= MAX, got {low} {high}")
    for option, value, minimum in (
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--concurrency", args.concurrency, 1),
    ):
        if value < minimum:
            raise ConfigError(f"{option}: must be >= {minimum}, got {value}")
    for option, value, allow_zero in (
        ("--duration", args.duration, False),
        ("--summary-interval", args.summary_interval, False),
        ("--request-interval", args.request_interval, True),
        ("--step-sleep", args.step_sleep, True),
    ):
        if value is not None and not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
            raise ConfigError(
                f"{option}: must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value}"
            )


def _resolve_device(requested: str) -> str:
    device = default_device()
    if requested == "cuda" and device != "cuda":
        raise ConfigError("--device cuda: no usable CUDA device on this machine")
    return device if requested == "auto" else requested


@contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """SIGTERM sets ``stop`` (Ctrl-C arrives as KeyboardInterrupt); the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Generation:
    """The demo's generate calls: request shapes, the step sleep and the stop signal."""

    def __init__(self, model: Any, device: str, stream: RequestStream, args: argparse.Namespace) -> None:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        self._torch = torch
        self._model = model
        self._device = device
        self._stream = stream
        self._interval = args.request_interval
        self.stop = threading.Event()
        self.completed = 0
        self.failure: BaseException | None = None
        self._lock = threading.Lock()
        step_sleep = args.step_sleep
        stop = self.stop

        class StepSleep(LogitsProcessor):
            # Runs on the host after each forward, before its token is sampled (where a token's time
            # ends), while the device has nothing queued: every call but the first (after the prefill)
            # belongs to a decode step, so each decode step is one forward plus one sleep, and the
            # prefill (TTFT) is untouched.
            def __init__(self, prompt_len: int) -> None:
                self.prompt_len = prompt_len

            def __call__(self, input_ids: Any, scores: Any) -> Any:
                if input_ids.shape[-1] > self.prompt_len:
                    time.sleep(step_sleep)
                return scores

        class StopWhenAsked(StoppingCriteria):
            # Ends running requests at their next step, so shutdown never waits for a long output.
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full(
                    (input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device
                )

        self._step_sleep = StepSleep if step_sleep else None
        self._logits_processors = LogitsProcessorList
        self._stopping = StoppingCriteriaList([StopWhenAsked()])
        self._vocab = min(256, model.config.vocab_size)  # byte ids: valid in every built-in vocabulary

    def generate(self, request: DemoRequest, seed: int) -> None:
        """One request: a prompt of random byte ids after BOS, drawn from ``seed``."""
        torch = self._torch
        generator = torch.Generator().manual_seed(seed)
        body = torch.randint(
            0, self._vocab, (request.batch_size, request.prompt_len - 1), generator=generator
        )
        bos = torch.full((request.batch_size, 1), BOS_TOKEN_ID)
        input_ids = torch.cat([bos, body], dim=1).to(self._device)
        kwargs: dict[str, Any] = {}
        if request.do_sample:
            torch.manual_seed(seed)  # sampling draws from the global generator
            kwargs.update(do_sample=True, temperature=0.8, top_k=50)
        else:
            kwargs.update(do_sample=False)
        if self._step_sleep is not None:
            sleep = self._step_sleep(input_ids.shape[-1])
            kwargs["logits_processor"] = self._logits_processors([sleep])
        with torch.inference_mode():
            self._model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=request.max_new_tokens,
                stopping_criteria=self._stopping,
                **kwargs,
            )

    def run_one(self) -> None:
        self.generate(*self._stream.next())
        with self._lock:
            self.completed += 1

    def worker(self) -> None:
        try:
            while not self.stop.is_set():
                self.run_one()
                if self._interval:
                    self.stop.wait(self._interval)
        except BaseException as exc:
            self.failure = exc
            self.stop.set()


def main(args: argparse.Namespace) -> int:
    _validate(args)
    try:
        config = InstrumentConfig.from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    device = _resolve_device(args.device)
    try:
        server = start_http_server(args.port, args.addr)
    except OSError as exc:
        if not isinstance(exc, ListenError):  # e.g. an unknown address: named as PortInUseError names it
            exc = ListenError(
                exc.errno, f"cannot serve metrics on {args.addr}:{args.port}: {exc.strerror or exc}"
            )
        raise with_flag_hint(exc, "--port", "--addr") from None
    try:
        return _serve(args, config, device, server.url)
    finally:
        server.close()


def _serve(args: argparse.Namespace, config: InstrumentConfig, device: str, url: str) -> int:
    from inferwatch.instrumentation import instrument
    from inferwatch.instrumentation.demo.models import load_model

    model_name = args.model_name or os.path.basename(os.path.normpath(args.model))
    print(f"inferwatch demo: metrics on {url}", flush=True)
    print(f"inferwatch demo: building {args.model} on {device}...", flush=True)
    try:
        model = load_model(args.model, device=device, seed=args.seed)
    except (OSError, ValueError) as exc:  # transformers' words for a directory it cannot load
        raise ConfigError(f"--model: cannot load {args.model!r}: {str(exc).splitlines()[0]}") from None
    context = getattr(model.config, "max_position_embeddings", None)
    if context is not None and args.prompt_len_range[1] + args.max_new_tokens > context:
        # Beyond the positions the model has, generate fails or, on the CPU, runs for minutes first.
        raise ConfigError(
            f"--prompt-len-range: MAX {args.prompt_len_range[1]} plus --max-new-tokens "
            f"{args.max_new_tokens} is beyond the model's {context} positions"
        )
    generation = _Generation(
        model, device, RequestStream(args.seed, tuple(args.prompt_len_range), args.max_new_tokens), args
    )
    # One request before instrumenting: the first generate of a process pays one-off set-up costs
    # (kernels, allocator) that would otherwise skew the first window.
    generation.generate(WARM_UP_REQUEST, args.seed)
    handle = instrument(model, model_name=model_name, config=config)
    summary = LiveSummary(REGISTRY, model_name)
    threads = [
        threading.Thread(target=generation.worker, name=f"demo-request-{i}", daemon=True)
        for i in range(args.concurrency)
    ]
    print(
        f"inferwatch demo: serving {model_name} with {args.concurrency} request thread(s)"
        f"{'' if args.duration is None else f' for {args.duration:g} s'}; Ctrl-C stops",
        flush=True,
    )
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        with _stop_on_sigterm(generation.stop):
            for thread in threads:
                thread.start()
            next_summary = time.monotonic() + args.summary_interval
            while not generation.stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                wake = next_summary if deadline is None else min(next_summary, deadline)
                if generation.stop.wait(max(0.0, wake - now)):
                    break
                if time.monotonic() >= next_summary:
                    print(summary.line(), flush=True)
                    next_summary += args.summary_interval
    except KeyboardInterrupt:
        pass
    finally:
        generation.stop.set()
        for thread in threads:
            thread.join()
        handle.remove()
    if generation.failure is not None:
        print(f"inferwatch demo: a request failed: {generation.failure!r}", file=sys.stderr)
        return 1
    print(f"inferwatch demo: stopped after {generation.completed} requests", flush=True)
    return 0
