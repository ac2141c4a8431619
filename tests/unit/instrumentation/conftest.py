"""Fixtures of the instrumentation tests: tiny real models (built once), a fresh registry per test, and
instrumentation that is always removed again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from inferwatch.instrumentation import InstrumentationHandle, instrument
from inferwatch.instrumentation.demo.models import PAD_TOKEN_ID, build_model, encode_text
from inferwatch.instrumentation.metrics.catalogue import existing_metrics
from tests.support import sample_value


@pytest.fixture(scope="session")
def llama() -> torch.nn.Module:
    return build_model("tiny-llama")


@pytest.fixture(scope="session")
def gpt2() -> torch.nn.Module:
    return build_model("tiny-gpt2")


@pytest.fixture(params=["tiny-llama", "tiny-gpt2"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    """Each test using it runs once per supported family."""
    return request.getfixturevalue({"tiny-llama": "llama", "tiny-gpt2": "gpt2"}[request.param])


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def instrumented(registry: CollectorRegistry) -> Iterator[Callable[..., InstrumentationHandle]]:
    """``instrumented(model, **kwargs)``: instrument on this test's registry; removed after the test."""
    handles: list[InstrumentationHandle] = []

    def _instrument(model: torch.nn.Module, **kwargs) -> InstrumentationHandle:
        kwargs.setdefault("registry", registry)
        handle = instrument(model, **kwargs)
        handles.append(handle)
        return handle

    yield _instrument
    for handle in handles:
        handle.remove()


def scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """A sample read back through the exposition format (sum over matching label sets)."""
    return sample_value(scrape(registry), name, **labels)


def batch_of(*texts: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` of the byte-encoded texts."""
    encoded = [encode_text(text) for text in texts]
    width = max(len(ids) for ids in encoded)
    ids = torch.tensor([[PAD_TOKEN_ID] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    return ids, mask


def wait_forgotten(registry: CollectorRegistry, name: str, timeout: float = 10.0) -> None:
    """Wait until the background thread has forgotten the collected model(s) named ``name`` (without
    scraping: a scrape changes nothing about models)."""
    metrics = existing_metrics(registry)
    deadline = time.monotonic() + timeout
    while metrics is not None and name in metrics.model_series:
        assert time.monotonic() < deadline, (
            f"model {name!r} still has live series {timeout} s after it was collected"
        )
        time.sleep(0.02)
