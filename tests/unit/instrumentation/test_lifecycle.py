"""Installing and removing: handles, idempotence, bad arguments."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation import InstrumentConfig, instrument
from inferwatch.instrumentation.demo.models import build_model
from tests.support.generation import generate_greedy
from tests.unit.instrumentation.conftest import batch_of, metric

pytestmark = pytest.mark.matrix


def test_remove_restores_the_model_completely(model, registry) -> None:
    pre_hooks, hooks = dict(model._forward_pre_hooks), dict(model._forward_hooks)
    handle = instrument(model, model_name="m", registry=registry)
    assert "generate" in vars(model)
    assert len(model._forward_pre_hooks) == len(pre_hooks) + 1
    assert len(model._forward_hooks) == len(hooks) + 1
    handle.remove()
    assert not handle.active
    assert "generate" not in vars(model)
    assert model.generate.__func__ is type(model).generate
    assert dict(model._forward_pre_hooks) == pre_hooks and dict(model._forward_hooks) == hooks
    assert model._forward_hooks_with_kwargs == {} and model._forward_pre_hooks_with_kwargs == {}
    assert metric(registry, "llm_model_info") is None
    generate_greedy(model, *batch_of("lifecycle"), new_tokens=3)
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 0
    handle.remove()  # idempotent


def test_instrument_is_idempotent(llama, registry, instrumented) -> None:
    handle = instrumented(llama, model_name="m")
    assert instrument(llama, model_name="m", registry=registry) is handle
    assert len(llama._forward_hooks) == 1 and len(llama._forward_pre_hooks) == 1
    generate_greedy(llama, *batch_of("lifecycle"), new_tokens=3)
    assert handle.flush()
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1  # counted once
    handle.remove()
    again = instrumented(llama, model_name="m")
    assert again is not handle and again.active
    generate_greedy(llama, *batch_of("lifecycle"), new_tokens=3)
    assert again.flush()
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 2


def test_same_default_registry_twice_does_not_collide(llama, gpt2) -> None:
    # registry=None is prometheus_client's REGISTRY: a second model must reuse its families.
    first = instrument(llama, model_name="default-registry-a")
    second = instrument(gpt2, model_name="default-registry-b")
    try:
        assert first.registry is None and second.registry is None
    finally:
        first.remove()
        second.remove()


def test_an_instance_generate_attribute_is_wrapped_and_restored(gpt2, registry) -> None:
    calls = []
    original = gpt2.generate

    def user_wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    gpt2.generate = user_wrapper
    try:
        handle = instrument(gpt2, model_name="m", registry=registry)
        generate_greedy(gpt2, *batch_of("lifecycle"), new_tokens=3)
        assert handle.flush() and calls == [1]
        assert metric(registry, "llm_requests_total", model="m", status="ok") == 1
        handle.remove()
        assert vars(gpt2)["generate"] is user_wrapper
    finally:
        del gpt2.generate


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (torch.nn.Linear(2, 2), "has no generate()"),
        ("gpt2", "needs a torch.nn.Module"),
        (None, "needs a torch.nn.Module"),
    ],
)
def test_unknown_model_types_are_refused(target, message, registry) -> None:
    with pytest.raises(TypeError, match=message):
        instrument(target, registry=registry)


def test_bad_arguments_are_refused(llama, registry) -> None:
    with pytest.raises(ValueError, match="model_name"):
        instrument(llama, model_name="", registry=registry)
    with pytest.raises(TypeError, match="InstrumentConfig"):
        instrument(llama, config={"ttft_buckets": [1]}, registry=registry)
    assert "generate" not in vars(llama) and not llama._forward_hooks


def test_buckets_of_a_registry_cannot_change(llama, gpt2) -> None:
    registry = CollectorRegistry()
    first = instrument(
        llama, model_name="a", registry=registry, config=InstrumentConfig(ttft_buckets=(0.1, 1))
    )
    try:
        with pytest.raises(ValueError, match="ttft_buckets"):
            instrument(gpt2, model_name="b", registry=registry, config=InstrumentConfig())
        assert "generate" not in vars(gpt2)
    finally:
        first.remove()


def test_instrumentation_follows_the_model_when_cast_after_instrument(registry, instrumented) -> None:
    # The launcher instruments models as they are loaded, before the program calls .to(device or dtype).
    model = build_model("tiny-llama")
    instrumented(model, model_name="m")
    assert metric(registry, "llm_model_info", model="m", dtype="float32") == 1
    model.to(torch.float64)
    generate_greedy(model, *batch_of("lifecycle"), new_tokens=3)
    assert metric(registry, "llm_model_info", model="m", dtype="float32") is None
    assert metric(registry, "llm_model_info", model="m", dtype="float64", device="cpu") == 1
    assert metric(registry, "llm_requests_total", model="m", status="ok") == 1
    assert metric(registry, "llm_instrumentation_errors_total") is None
