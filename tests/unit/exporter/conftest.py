"""In-process fixtures: a poller over the NVML stand-in, and its exposition as text."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from inferwatch.exporter.collectors import REGISTRY
from inferwatch.exporter.config import ExporterConfig
from inferwatch.exporter.exposition import Exposition
from inferwatch.exporter.poller import Poller

from tests.support import parse_samples
from tests.unit.exporter import fake_nvml

MakePoller = Callable[..., Poller]


@pytest.fixture
def fake() -> Iterator[Any]:
    """The stand-in, reset to two plain GPUs; a test calls ``fake.reset(...)`` for another scenario."""
    fake_nvml.reset()
    yield fake_nvml
    fake_nvml.reset()


@pytest.fixture
def make_poller(fake: Any) -> Iterator[MakePoller]:
    """Pollers over the stand-in (XID thread off unless asked for), stopped at the end of the test.

    Keywords are fields of :class:`ExporterConfig` or collector names, which switch a collector on or off
    (``gpm=False``)."""
    pollers: list[Poller] = []

    def make(**config: Any) -> Poller:
        switches = {"xid": False} | {name: config.pop(name) for name in list(config) if name in REGISTRY}
        poller = Poller(dataclasses.replace(ExporterConfig(), **config).switched(**switches), fake, "test")
        pollers.append(poller)
        return poller

    yield make
    for poller in pollers:
        poller.stop()
    # A collection held up by a hung call finishes after its poller stopped, and would call the stand-in
    # (counted in fake.calls) during the next test: let it end here.
    deadline = time.monotonic() + 10
    for thread in threading.enumerate():
        if thread.name.startswith("gpu") and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def render(poller: Poller) -> str:
    """The text a scrape of ``poller``'s exporter would return."""
    return Exposition(poller).render(None)[0].decode()


def gpu_value(text: str, metric: str, gpu: int, /, **labels: str) -> float | None:
    """Sum of the samples of ``metric`` for GPU ``gpu`` with ``labels`` (which may include ``name``)."""
    wanted = {"gpu": str(gpu), **labels}.items()
    found = [s.value for s in parse_samples(text) if s.name == metric and wanted <= s.labels.items()]
    return sum(found) if found else None


def own_process() -> list[list[int]]:
    """A GPU process entry for the stand-in that names a process which exists: this one."""
    return [[os.getpid(), 3 << 30]]
