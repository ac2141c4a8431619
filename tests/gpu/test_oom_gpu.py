"""A real CUDA out-of-memory inside an instrumented generate: counted, re-raised unchanged, and the
process keeps serving (requests and the metrics endpoint) afterwards. Skipped without CUDA.

The OOM is provoked for real: the caching allocator is capped with
``torch.cuda.set_per_process_memory_fraction`` just above what the model already holds, then a request
asks for far more (a large batch of long prompts: the prefill's logits alone are gigabytes).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.endpoint.server import start_http_server
from tests.support import http_get, sample_value
from tests.support.generation import generate_greedy

pytestmark = pytest.mark.gpu


@pytest.fixture
def capped_model() -> Iterator[torch.nn.Module]:
    model = build_model("small-llama", device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    headroom = 256 * 2**20  # enough for small requests, far too little for the large one
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + headroom) / total)
    try:
        yield model
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        del model
        torch.cuda.empty_cache()


def _random_prompt(batch: int, prompt_length: int) -> torch.Tensor:
    """``batch`` rows of ``prompt_length`` random token ids, on the GPU."""
    return torch.randint(0, 256, (batch, prompt_length), device="cuda")


def test_real_oom_is_counted_reraised_and_serving_continues(capped_model) -> None:
    registry = CollectorRegistry()
    handle = instrument(capped_model, model_name="m", registry=registry)
    server = start_http_server(port=0, addr="127.0.0.1", registry=registry)
    try:
        generate_greedy(capped_model, _random_prompt(1, 16), new_tokens=4, exact_length=False)
        with pytest.raises(torch.cuda.OutOfMemoryError) as raised:
            generate_greedy(capped_model, _random_prompt(64, 4096), new_tokens=4, exact_length=False)
        # The original exception, untouched: its message is the allocator's own.
        assert "CUDA out of memory" in str(raised.value)
        del raised
        torch.cuda.empty_cache()
        after = generate_greedy(capped_model, _random_prompt(2, 32), new_tokens=6, exact_length=False)
        assert after.shape == (2, 38)
        assert handle.flush()
        status, text = http_get(server.url)
    finally:
        server.close()
        handle.remove()
    assert status == 200
    assert sample_value(text, "llm_oom_events_total", model="m") == 1
    assert sample_value(text, "llm_requests_total", model="m", status="oom") == 1
    assert sample_value(text, "llm_requests_total", model="m", status="ok") == 2
    assert sample_value(text, "llm_requests_running", model="m") == 0
    assert sample_value(text, "llm_instrumentation_errors_total") is None


def test_hooks_are_removed_on_the_gpu() -> None:
    model = build_model("tiny-llama", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(0))

    def greedy() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)

    def hooks() -> tuple:
        return dict(model._forward_pre_hooks), dict(model._forward_hooks), "generate" in model.__dict__

    before, plain = hooks(), greedy()
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    watched = greedy()
    handle.remove()
    assert hooks() == before
    assert torch.equal(watched, plain)
    assert torch.equal(greedy(), plain)
