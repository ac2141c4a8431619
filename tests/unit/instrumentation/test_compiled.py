"""generate's compiled decode path (static cache + ``torch.compile``), on the CPU with dynamo's eager
backend: the same path transformers takes on CUDA, without a GPU or a C compiler.

dynamo traces the model's forward hooks into the compiled region; ``fullgraph=True`` makes anything there
it cannot trace (a clock read, a context variable) an error, so a generate that completes proves the hooks
fold to nothing; dynamo's counters show no graph break and nothing recompiled when hooks come or go.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.models import build_model
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

from tests.unit.instrumentation.conftest import metric

NEW_TOKENS = 6

dynamo = pytest.importorskip("torch._dynamo")


def compiled_generation_config() -> GenerationConfig:
    compile_config = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    return GenerationConfig(
        cache_implementation="static",
        compile_config=compile_config,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )


@pytest.fixture
def compiled_llama() -> Iterator[torch.nn.Module]:
    """A model of its own: compiling attaches state (``_compiled_call``) that other tests must not see."""
    dynamo.reset()
    yield build_model("tiny-llama")
    dynamo.reset()


def generate(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(
            ids, attention_mask=torch.ones_like(ids), generation_config=compiled_generation_config()
        )


def frames_compiled() -> int:
    return int(dynamo.utils.counters["stats"]["unique_graphs"])


def graph_breaks() -> int:
    return sum(dynamo.utils.counters["graph_break"].values())


def test_the_compiled_decode_step_is_timed_without_a_graph_break_or_a_recompile(compiled_llama) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (2, 5), generator=torch.Generator().manual_seed(0))
    bare = generate(model, ids)  # compiles the decode step, with no hooks on the model
    assert hasattr(model, "_compiled_call"), "transformers did not take its compiled path"
    graphs = frames_compiled()

    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    watched = generate(model, ids)  # fullgraph=True: a graph break would raise here
    handle.flush()
    handle.remove()
    again = generate(model, ids)

    assert torch.equal(watched, bare) and torch.equal(again, bare)
    assert frames_compiled() == graphs, "instrument() or remove() made dynamo compile again"
    assert graph_breaks() == 0
    # The prefill runs eagerly (through the hooks), every decode step through the compiled call.
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="prefill") == 1
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == NEW_TOKENS - 1
    assert metric(registry, "llm_time_to_first_token_seconds_count", model="m") == 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == NEW_TOKENS - 1
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * NEW_TOKENS


def test_a_model_instrumented_before_its_first_compile_traces_no_hook(compiled_llama) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(1))
    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    watched = generate(model, ids)  # the first trace sees the hooks: they must fold to nothing
    handle.flush()
    graphs = frames_compiled()
    handle.remove()
    bare = generate(model, ids)
    assert torch.equal(watched, bare)
    assert frames_compiled() == graphs
    assert graph_breaks() == 0
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == NEW_TOKENS - 1
