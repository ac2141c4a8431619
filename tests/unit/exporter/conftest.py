"""In-process fixtures: a poller over the NVML stand-in on a manual clock, and its exposition as text.

Time moves only when a test advances ``clock``: the GPM window, firmware turns, the NVML retry interval
and the stand-in's time-derived readings all follow it, so no unit test sleeps for them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.clock import ManualClock
from tests.support.fake_nvml import FakeNvml
from tests.support.pollers import MakePoller, Pollers, gpu_value, own_process, render

__all__ = ["MakePoller", "gpu_value", "own_process", "render"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> FakeNvml:
    """The stand-in: two plain GPUs; a test calls ``fake.reset(...)`` for another scenario."""
    return FakeNvml(clock=clock)


@pytest.fixture
def make_poller(fake: FakeNvml, clock: ManualClock) -> Iterator[MakePoller]:
    """Pollers over the stand-in and the test's clock, stopped at the end of the test."""
    pollers = Pollers(fake, clock)
    yield pollers
    pollers.stop()
