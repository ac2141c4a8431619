"""Placing device marks on the host clock when the anchor itself ran late, on a simulated device.

A real GPU can be made neither to run the anchor late nor to stay busy at a chosen moment on demand, so
these tests drive :class:`Request` with a clock whose marks complete at host times the test chooses; the
GPU accuracy benchmark and ``tests/gpu`` check the same logic against ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.device.worker import Worker
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from inferwatch.instrumentation.timing.clock import Anchor
from inferwatch.instrumentation.timing.request import DRAIN_BATCH, Request, Step
from tests.unit.instrumentation.conftest import metric

US = 1e-6
ANCHOR_LATE = 300 * US  # a GPU coming out of idle, as measured on the H200 (docs/timing.md)


@dataclass(frozen=True)
class Mark:
    """A device mark: the true host time at which the device reached it."""

    reached: float


class SimulatedDeviceClock:
    """A device whose timestamps are exact but whose anchor completed ANCHOR_LATE after its host reading,
    so that every mark maps that much early unless the request bounds the lag."""

    device = torch.device("cuda", 0)

    def __init__(self, anchor_host: float) -> None:
        self._anchor_host = anchor_host

    def start(self) -> Anchor:
        return Anchor(self._anchor_host, Mark(self._anchor_host + ANCHOR_LATE))

    def mark(self) -> Mark:
        raise AssertionError("the test records marks itself")

    def ready(self, mark: Mark) -> bool:
        return True

    def host_time(self, anchor: Anchor, mark: Mark) -> float:
        return anchor.host + self.elapsed(anchor.event, mark)

    def elapsed(self, earlier: Mark, later: Mark) -> float:
        return later.reached - earlier.reached

    def release(self, mark: object) -> None:
        pass

    def fetch(self, tensor: torch.Tensor) -> None:
        raise AssertionError("not used")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def run_request(registry: CollectorRegistry, forwards: list[tuple[float, float, float, float]]) -> None:
    """One generate-like request entered at t=0: per forward (host call, device start, host end of the
    hook, device end); the first is the prefill and every forward yields a token."""
    series = series_for(metrics_for(registry, InstrumentConfig()), "m")
    request = Request(
        series,
        SimulatedDeviceClock(anchor_host=5 * US),
        owner=object(),
        entry=0.0,
        background=Worker("test").lane(),
    )
    for index, (start_host, started, end_host, ended) in enumerate(forwards):
        phase = "prefill" if index == 0 else "decode"
        step = Step(
            series=series,
            device="cuda:0",
            phase=phase,
            start=Mark(started),
            end=Mark(ended),
            tokens=1,
            start_host=start_host,
            end_host=end_host,
            batch=1,
        )
        request.add(step)
        request.drain_batch()
    request.finish("ok")
    assert request.resolve()


def decode_steps(first_call: float, count: int, step: float) -> list[tuple[float, float, float, float]]:
    """Decode forwards of a launch-bound loop: the host calls each once the previous token was read, and
    the idle device starts it 2 µs later."""
    return [
        (
            first_call + i * step,
            first_call + i * step + 2 * US,
            first_call + i * step + 50 * US,
            first_call + (i + 1) * step - 100 * US,
        )
        for i in range(count)
    ]


def test_a_late_anchor_is_bounded_by_a_decode_step_start_even_when_the_prefill_cannot_bound_it(
    registry: CollectorRegistry,
) -> None:
    # The device is busy with earlier work when the prefill is called (it starts 200 µs later) and the
    # prefill runs 5 ms, so its own marks bound the anchor's lateness only to 100 µs of the 300.
    prefill = (100 * US, 300 * US, 200 * US, 5_000 * US)
    decode = decode_steps(5_200 * US, DRAIN_BATCH + 3, 4_000 * US)
    run_request(registry, [prefill, *decode])

    assert metric(registry, "llm_time_to_first_token_seconds_sum", model="m") == pytest.approx(
        5_000 * US, abs=3 * US
    )
    # The prefill starts when the device started it (after the earlier work), not at the host's call.
    assert metric(registry, "llm_request_prefill_seconds_sum", model="m") == pytest.approx(
        4_700 * US, abs=3 * US
    )
    # Gaps between tokens are differences of device marks: exact whatever the anchor did.
    itl_sum = metric(registry, "llm_inter_token_latency_seconds_sum", model="m")
    assert itl_sum == pytest.approx(decode[-1][3] - prefill[3], abs=1e-9)


def test_the_prefill_starts_at_the_hosts_call_when_the_device_was_idle(registry: CollectorRegistry) -> None:
    prefill = (100 * US, 102 * US, 200 * US, 5_000 * US)
    run_request(registry, [prefill, *decode_steps(5_200 * US, DRAIN_BATCH, 4_000 * US)])

    assert metric(registry, "llm_request_prefill_seconds_sum", model="m") == pytest.approx(
        4_900 * US, abs=3 * US
    )
    assert metric(registry, "llm_time_to_first_token_seconds_sum", model="m") == pytest.approx(
        5_000 * US, abs=3 * US
    )
