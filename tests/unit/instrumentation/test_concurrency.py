"""Several threads calling generate on one instrumented model at once."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.unit.instrumentation.conftest import batch_of, metric

pytestmark = pytest.mark.matrix

THREADS = 4
REQUESTS_PER_THREAD = 3


def test_concurrent_generate_from_four_threads(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m")
    # Different lengths per thread, so a step attributed to the wrong request would change the counts.
    plan = {
        t: [(2 + t + r, f"thread {t} request {r}" * (t + 1)) for r in range(REQUESTS_PER_THREAD)]
        for t in range(THREADS)
    }
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    failures: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def serve(t: int) -> None:
        try:
            barrier.wait()
            for r, (new_tokens, text) in enumerate(plan[t]):
                ids, mask = batch_of(text)
                outputs[t, r] = llama.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                )
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=serve, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures and len(outputs) == THREADS * REQUESTS_PER_THREAD
    assert handle.flush()

    requests = THREADS * REQUESTS_PER_THREAD
    new_tokens = sum(n for steps in plan.values() for n, _ in steps)
    prompt_tokens = sum(1 + len(text.encode()) for steps in plan.values() for _, text in steps)
    assert metric(registry, "llm_requests_total", model="m", status="ok") == requests
    assert metric(registry, "llm_generation_tokens_total", model="m") == new_tokens
    assert metric(registry, "llm_prompt_tokens_total", model="m") == prompt_tokens
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == requests
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == new_tokens - requests
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="prefill") == requests
    assert metric(registry, "llm_forward_seconds_count", model="m") == new_tokens
    assert metric(registry, "llm_requests_running", model="m") == 0
    assert metric(registry, "llm_kv_cache_bytes", model="m") == 0
    assert metric(registry, "llm_instrumentation_errors_total") is None
    for t, steps in plan.items():  # every output is what this thread asked for
        for r, (n, text) in enumerate(steps):
            assert outputs[t, r].shape[1] == 1 + len(text.encode()) + n
