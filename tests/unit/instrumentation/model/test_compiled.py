"""generate's compiled decode path (static cache + ``torch.compile``), on the CPU with dynamo's eager
backend: the same path transformers takes on CUDA, without a GPU or a C compiler.

dynamo traces the model's forward hooks into the compiled region; ``fullgraph=True`` makes anything there
it cannot trace (a clock read, a context variable) an error, so a generate that completes proves the hooks
fold to nothing; dynamo's counters show no graph break and nothing recompiled when hooks come or go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.timing import request
from tests.unit.instrumentation.conftest import metric

pytestmark = pytest.mark.matrix

NEW_TOKENS = 6

dynamo = pytest.importorskip("torch._dynamo")


def compiled_generation_config(new_tokens: int = NEW_TOKENS) -> GenerationConfig:
    compile_config = CompileConfig(backend="eager", fullgraph=True, dynamic=False)
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    return GenerationConfig(
        cache_implementation="static",
        compile_config=compile_config,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )


@pytest.fixture
def compiled_llama() -> Iterator[torch.nn.Module]:
    """A model of its own: compiling attaches state (``_compiled_call``) that other tests must not see."""
    dynamo.reset()
    yield build_model("tiny-llama")
    dynamo.reset()


def generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(
            ids, attention_mask=torch.ones_like(ids), generation_config=compiled_generation_config(new_tokens)
        )


class HookCounter:
    """Stands in for the model's compiled call (transformers returns ``model._compiled_call`` while its
    compile config is unchanged): counts the forward hooks the model has while each call runs, and runs
    ``during`` at the given call."""

    def __init__(
        self,
        model: torch.nn.Module,
        during: tuple[int, Callable[[], None]] | None = None,
        *,
        eager: bool = False,
    ) -> None:
        # eager: run the module's own __call__ instead, as dynamo does when it gives up on a frame
        self.compiled = model.__call__ if eager else model._compiled_call
        self.model = model
        self.during = during
        self.hooks: list[tuple[int, int]] = []
        model._compiled_call = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.hooks.append((len(self.model._forward_pre_hooks), len(self.model._forward_hooks)))
        if self.during is not None and self.during[0] == len(self.hooks):
            self.during[1]()
        return self.compiled(*args, **kwargs)


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


def test_a_long_compiled_generate_is_resolved_in_runs_while_it_decodes(compiled_llama, monkeypatch) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (2, 5), generator=torch.Generator().manual_seed(2))
    new_tokens = request.RUN_DRAIN_MARKS + 20  # two drains of a run while generating, one at its exit
    bare = generate(model, ids, new_tokens)
    resolved: list[int] = []
    resolve_run = request.Request._resolve_run

    def counting(self: request.Request, run: request.DecodeRun, observations: Any) -> bool:
        resolved.append(len(run.marks))
        return resolve_run(self, run, observations)

    monkeypatch.setattr(request.Request, "_resolve_run", counting)
    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    watched = generate(model, ids, new_tokens)
    assert handle.flush()
    assert torch.equal(watched, bare)
    decode_steps = new_tokens - 1
    # Prefill and the first decode step go through the hooks; the run takes the rest, in drains of
    # RUN_DRAIN_MARKS marks (two per step) and what is left at the exit.
    batch, run_marks = request.RUN_DRAIN_MARKS, 2 * (decode_steps - 1)
    assert resolved == [batch, batch, run_marks - 2 * batch]
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == decode_steps
    assert metric(registry, "llm_step_tokens_count", model="m", kind="decode") == decode_steps
    assert metric(registry, "llm_step_tokens_sum", model="m", kind="decode") == 2 * decode_steps
    assert metric(registry, "llm_batch_size_count", model="m") == new_tokens
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == decode_steps
    assert metric(registry, "llm_generation_tokens_total", model="m") == 2 * new_tokens
    # The gaps between tokens add up to the decode phase: no token lost or placed twice.
    gaps = metric(registry, "llm_inter_token_latency_seconds_sum", model="m")
    decode = metric(registry, "llm_request_decode_seconds_sum", model="m")
    assert gaps == pytest.approx(decode, rel=1e-9)
    assert metric(registry, "llm_instrumentation_errors_total") in (None, 0)


def test_the_forward_hooks_are_out_of_the_compiled_call_and_back_after_it(compiled_llama) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(3))
    generate(model, ids)  # compiles: model._compiled_call exists from here on
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    counter = HookCounter(model)
    generate(model, ids)
    assert counter.hooks == [(0, 0)] * (NEW_TOKENS - 1)
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == (1, 1)
    handle.remove()
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == (0, 0)


def test_hooks_of_the_users_keep_ours_in_and_nothing_is_timed_twice(compiled_llama) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(4))
    model.register_forward_hook(lambda module, args, output: None)  # a user's hook, traced to nothing
    generate(model, ids)
    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    counter = HookCounter(model)
    generate(model, ids)
    handle.flush()
    assert counter.hooks == [(1, 2)] * (NEW_TOKENS - 1)
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == NEW_TOKENS - 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == NEW_TOKENS - 1


def test_removing_the_instrumentation_during_a_compiled_call_leaves_no_hook(compiled_llama) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(5))
    bare = generate(model, ids)
    handle = instrument(model, model_name="m", registry=CollectorRegistry())
    counter = HookCounter(model, during=(3, handle.remove))
    watched = generate(model, ids)
    assert torch.equal(watched, bare)
    assert len(counter.hooks) == NEW_TOKENS - 1
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == (0, 0)


@pytest.mark.parametrize("users_hook", [False, True])
def test_a_compiled_call_that_dynamo_runs_eagerly_is_timed_once(compiled_llama, users_hook) -> None:
    model, ids = compiled_llama, torch.randint(1, 200, (1, 4), generator=torch.Generator().manual_seed(6))
    if users_hook:  # our hooks stay in the model, so they see the eager forwards inside the call
        model.register_forward_hook(lambda module, args, output: None)
    generate(model, ids)
    registry = CollectorRegistry()
    handle = instrument(model, model_name="m", registry=registry)
    HookCounter(model, eager=True)
    generate(model, ids)
    assert handle.flush()
    assert metric(registry, "llm_forward_seconds_count", model="m", phase="decode") == NEW_TOKENS - 1
    assert metric(registry, "llm_inter_token_latency_seconds_count", model="m") == NEW_TOKENS - 1
