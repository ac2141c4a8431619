"""The demo's families as a scrape renders them, byte for byte against a committed golden file.

The demo's own requests (its seeded model and request stream: batched, sampled and greedy generate
calls), a tracked request and a continuous-batching batch run in-process on a fresh registry; what they
count (requests, tokens, observations per histogram, batch sizes, KV bytes) is the same in every run, so
the exposition is too once the values that are wall time are masked. A refactor of the hot path that
changes what a request observes, or how often, changes this text.

``INFERWATCH_UPDATE_GOLDEN=1`` rewrites the golden file instead of comparing (review the diff).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from transformers import GenerationConfig

from inferwatch.instrumentation import instrument, track_request
from inferwatch.instrumentation.demo.command import RequestStream, _Generation
from inferwatch.instrumentation.demo.models import build_model
from tests.support.batching import small_page_pool

pytestmark = pytest.mark.matrix

GOLDEN = Path(__file__).parent / "golden" / "demo_families.txt"
MODEL = "demo-golden"
SEED = 7
REQUESTS = 6
#: Families whose values are durations, instants or ratios of durations: masked, except a histogram's
#: ``_count`` (how many were observed is exact).
_TIMED = re.compile(r"^llm_\w*(_seconds|_ratio)(_bucket|_sum|_created)?$")
#: Gauges the background sampler writes from what it reads when its period comes round (the paged cache's
#: blocks, free device memory): whether a reading fell inside the run is timing, so their samples go.
_SAMPLED = re.compile(r"^llm_kv_cache_(blocks|capacity_bytes|capacity_tokens|headroom_tokens)$")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)$")


def normalised(text: str) -> str:
    """``text`` with every wall-time value, and every ``_created`` timestamp, replaced by ``*``, and
    without the sampled gauges' samples."""
    lines = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            name = match["name"]
            if _SAMPLED.match(name):
                continue
            if name.endswith("_created") or (_TIMED.match(name) and not name.endswith("_count")):
                line = f"{name}{match['labels'] or ''} *"
        lines.append(line)
    return "\n".join(lines) + "\n"


def run_the_demos_requests(registry: CollectorRegistry) -> None:
    model = build_model("tiny-llama", seed=SEED)
    arguments = argparse.Namespace(request_interval=0.0, step_sleep=0.0)
    generation = _Generation(model, "cpu", RequestStream(SEED, (8, 24), 12), arguments)
    handle = instrument(model, model_name=MODEL, registry=registry)
    try:
        for _ in range(REQUESTS):
            generation.run_one()
        with track_request(MODEL, prompt_tokens=5, registry=registry) as request, torch.inference_mode():
            for _ in range(4):
                request.token()
        config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1)
        model.generate_batch(
            [[1, 5, 9, 2], [1, 7, 7, 7, 7, 3]],
            generation_config=config,
            continuous_batching_config=small_page_pool(),
        )
        assert handle.flush(10.0)
    finally:
        handle.remove()


def test_the_demos_families_render_as_the_golden_file() -> None:
    registry = CollectorRegistry()
    run_the_demos_requests(registry)
    text = normalised(generate_latest(registry).decode())
    if os.environ.get("INFERWATCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
