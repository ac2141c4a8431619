"""In-process exporter pollers over the NVML stand-in, for the unit tier (on a manual clock) and for the
integration tests that need real threads and real time (hung calls against a real timeout)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from inferwatch.common.clock import Clock
from inferwatch.exporter.collectors import REGISTRY
from inferwatch.exporter.config import ExporterConfig
from inferwatch.exporter.exposition import ScrapeRenderer
from inferwatch.exporter.poller import Poller
from tests.support import parse_samples
from tests.support.fake_nvml import FakeNvml

MakePoller = Callable[..., Poller]


class Pollers:
    """Makes pollers over one stand-in and one clock (XID thread off unless asked for), and stops them.

    Keywords are fields of :class:`ExporterConfig` or collector names: True or False switches a collector
    on or off (``gpm=False``), a dict changes fields of its settings (``gpm={"window": 0.3}``)."""

    def __init__(self, fake: FakeNvml, clock: Clock) -> None:
        self._fake, self._clock = fake, clock
        self._made: list[Poller] = []

    def __call__(self, **config: Any) -> Poller:
        collectors = {name: config.pop(name) for name in list(config) if name in REGISTRY}
        switches = {"xid": False} | {name: on for name, on in collectors.items() if isinstance(on, bool)}
        settings = dataclasses.replace(ExporterConfig(), **config).switched(**switches)
        for name, changes in collectors.items():
            if not isinstance(changes, bool):
                settings = settings.with_settings(name, **changes)
        poller = Poller(settings, self._fake, "test", clock=self._clock)  # type: ignore[arg-type]
        self._made.append(poller)
        return poller

    def stop(self) -> None:
        """Stop every poller made, then let a collection held up by a hung call end (it would call the
        stand-in, counted in its calls, after the test)."""
        for poller in self._made:
            poller.stop()
        deadline = time.monotonic() + 10
        for thread in threading.enumerate():
            if thread.name.startswith("gpu") and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


def render(poller: Poller) -> str:
    """The text a scrape of ``poller``'s exporter would return."""
    return ScrapeRenderer(poller).render(None)[0].decode()


def gpu_value(text: str, metric: str, gpu: int, /, **labels: str) -> float | None:
    """Sum of the samples of ``metric`` for GPU ``gpu`` with ``labels`` (which may include ``name``)."""
    wanted = {"gpu": str(gpu), **labels}.items()
    found = [s.value for s in parse_samples(text) if s.name == metric and wanted <= s.labels.items()]
    return sum(found) if found else None


def own_process() -> list[list[int]]:
    """A GPU process entry for the stand-in that names a process which exists: this one."""
    return [[os.getpid(), 3 << 30]]
