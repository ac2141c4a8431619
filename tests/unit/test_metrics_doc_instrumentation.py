"""docs/metrics.md's Instrumentation section and what a live instrumented model exposes, both ways.

The live model is tiny-llama on this machine's CPU, instrumented and serving requests (greedy, sampled,
batched), scraped over real HTTP. Peak FLOP/s and memory bandwidth are configured so the utilization
ratios, which need a known peak, have series on a CPU too, and one internal error is injected (the
observer of one histogram fails) so ``llm_instrumentation_errors_total`` has a series, the way an event
is injected for the exporter's event counters. Rows whose meaning starts with ``*CUDA only.*`` describe
series a CPU model cannot have (the CUDA allocator, NVML); every other documented metric must have one.
On a GPU machine the same test runs on CUDA too, where every documented metric must have a series.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from transformers import GenerationConfig

from inferwatch.instrumentation import InstrumentationHandle, InstrumentConfig, instrument
from inferwatch.instrumentation.demo.models import build_model, encode_text
from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware
from inferwatch.instrumentation.endpoint.server import start_http_server
from inferwatch.instrumentation.metrics import catalogue as cat
from tests.support import METRICS_DOC, documented_metrics, http_get
from tests.support.asgi_server import serve_asgi
from tests.support.batching import small_page_pool

pytestmark = pytest.mark.matrix

SECTION = "Instrumentation"
CUDA_ONLY = "*CUDA only.*"
MODEL = "live"


def cuda_only_metrics() -> set[str]:
    """Documented metrics whose meaning cell starts with the CUDA-only marker."""
    names, in_section = set(), False
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_section = line[3:].startswith(SECTION)
        elif in_section and line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if cells[-1].startswith(CUDA_ONLY):
                names.add(cells[0].strip("`"))
    return names


def llm_families(text: str) -> tuple[dict[str, str], set[str]]:
    """The ``llm_*`` families of an exposition as a user reads them (counters with ``_total``): name ->
    type, and the names of those with at least one series. prometheus_client's ``*_created`` companions
    of counters and histograms parse as gauge families of their own and are left out."""
    parsed = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("llm_")}
    types, with_series = {}, set()
    for name, family in parsed.items():
        parent = parsed.get(name.removesuffix("_created"))
        if name.endswith("_created") and parent is not None and parent.type in ("counter", "histogram"):
            continue
        user_name = name + "_total" if family.type == "counter" else name
        types[user_name] = family.type
        if family.samples:
            with_series.add(user_name)
    return types, with_series


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def live_model(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[torch.nn.Module, InstrumentationHandle, CollectorRegistry]]:
    """tiny-llama instrumented on a registry of its own, on the CPU, and on the GPU where there is one
    (where every documented metric, the CUDA-only ones included, must have a series)."""
    registry = CollectorRegistry()
    config = InstrumentConfig(
        poll_interval_seconds=0.2, peak_flops=1e11, peak_memory_bandwidth_bytes_per_second=2e10
    )
    model = build_model("tiny-llama", device=request.param)
    handle = instrument(model, model_name=MODEL, config=config, registry=registry)
    try:
        yield model, handle, registry
    finally:
        handle.remove()


def serve_one_http_request(model: torch.nn.Module, prompt: torch.Tensor, registry: CollectorRegistry) -> None:
    """One request through the ASGI middleware under a real uvicorn on loopback (what the server sent,
    llm_response_*; when the kernel received it, llm_request_socket_wait_seconds)."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.to_thread(model.generate, prompt, max_new_tokens=3, do_sample=False)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"tokens", "more_body": False})

    with serve_asgi(ArrivalMiddleware(app, registry=registry)) as base:
        request = urllib.request.Request(f"{base}/generate", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.read() == b"tokens"


def test_every_exposed_metric_is_documented_and_every_documented_one_exposed(
    live_model: tuple[torch.nn.Module, InstrumentationHandle, CollectorRegistry],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, handle, registry = live_model
    on_cuda = handle.device.type == "cuda"
    prompts = torch.tensor([encode_text("both ways"), encode_text("two sides")], device=handle.device)
    mask = torch.ones_like(prompts)
    model.generate(prompts, attention_mask=mask, max_new_tokens=6, do_sample=False)
    model.generate(prompts[:1], attention_mask=mask[:1], max_new_tokens=6, do_sample=True, top_k=20)
    # Speculative decoding without a second model (prompt lookup): its draft and accepted counters.
    model.generate(prompts[:1], attention_mask=mask[:1], max_new_tokens=6, prompt_lookup_num_tokens=2)

    def broken_observe(value: float) -> None:
        raise ZeroDivisionError("injected inferwatch bug")

    ttft = cat.metrics_for(registry, handle.config)[cat.TTFT].labels(MODEL)
    monkeypatch.setattr(ttft, "observe", broken_observe)
    model.generate(prompts[1:], attention_mask=mask[1:], max_new_tokens=3, do_sample=False)
    monkeypatch.undo()
    serve_one_http_request(model, prompts[:1], registry)
    # Continuous batching: its paged cache is reported while its manager is alive.
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1),
        continuous_batching_config=small_page_pool(),
    )
    manager.start()
    try:
        manager.add_request(encode_text("batched"), max_new_tokens=4)
        assert manager.get_result(timeout=60) is not None
        assert handle.flush()

        documented = documented_metrics(SECTION)
        cuda_only = cuda_only_metrics()
        assert cuda_only <= set(documented)
        expected_series = set(documented) if on_cuda else set(documented) - cuda_only
        with start_http_server(0, registry=registry) as server:
            deadline = time.monotonic() + 10  # the ratios and the headroom come with the sampler's next poll
            while True:
                exposed, with_series = llm_families(http_get(server.url)[1])
                if expected_series <= with_series or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
    finally:
        # The manager's generation thread is not a daemon: left running, it holds pytest at exit.
        manager.stop(block=True)

    assert sorted(set(exposed) - set(documented)) == [], "exposed but not in docs/metrics.md"
    assert sorted(set(documented) - set(exposed)) == [], "in docs/metrics.md but not exposed"
    assert {name: exposed[name] for name in documented} == documented, "types differ"
    assert sorted(expected_series - with_series) == [], "documented (and not CUDA-only on CPU), no series"
