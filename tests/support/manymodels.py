"""One serving process with many instrumented models, for the endpoint's tests and benchmarks at 64
models (issue 41): the models, a thread that makes one of them generate now and then, a ticking counter
that dates every collection, and a Prometheus-like scraper that measures each answer's age and latency,
run in a process of its own as Prometheus is (``python -m tests.support.manymodels PORT SECONDS``): in
the serving process its thread would wait for the GIL behind the model's.

Only public names of inferwatch are used (``instrument``, ``start_http_server``, the demo's models), so
the benchmark can run the same code against an older tree (tests/benchmarks/endpoint_models.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tests.support.httpload import PROMETHEUS_HEADERS, scrape_every

TICKS = "inferwatch_test_ticks"
_TICKS_SAMPLE = re.compile(rf"^{TICKS}_total (\S+)$", re.MULTILINE)
#: The header that states an answer's collection age (inferwatch.instrumentation.endpoint.app.AGE_HEADER).
AGE_HEADER = "Inferwatch-Collection-Age"


def build_models(
    count: int, registry: CollectorRegistry, name: str = "tiny-llama", config: Any = None
) -> tuple[list, list]:
    """``count`` instrumented copies of a built-in model on ``registry``, named ``model-00``... (with
    ``config``, an ``InstrumentConfig``, where given): the models and their handles. One build,
    deep-copied: the same weights, distinct modules (hooks are per object)."""
    from inferwatch.instrumentation import instrument
    from inferwatch.instrumentation.demo.models import build_model

    base = build_model(name)
    # Copied before any is instrumented: an instrumented model holds locks, which do not copy.
    models = [base, *(copy.deepcopy(base) for _ in range(count - 1))]
    handles = []
    for index, model in enumerate(models):
        handles.append(instrument(model, model_name=f"model-{index:02d}", config=config, registry=registry))
    return models, handles


class Generating(threading.Thread):
    """Every ``pause`` seconds, one model (in turn, each before any twice, then at random) generates
    ``tokens`` tokens; failures are kept for the caller."""

    def __init__(self, models: list, pause: float = 0.1, tokens: int = 8, seed: int = 41) -> None:
        super().__init__(name="test-generate", daemon=True)
        self.models = models
        self.pause = pause
        self.tokens = tokens
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.requests = 0
        self._random = random.Random(seed)

    def generate(self, model: Any) -> None:
        import torch

        from inferwatch.instrumentation.demo.models import encode_text

        ids = torch.tensor([encode_text("How old is this scrape?")])
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.tokens,
                min_new_tokens=self.tokens,
                do_sample=False,
            )
        self.requests += 1

    def warm(self) -> None:
        """Every model serves one request (all its series exist), before the thread starts."""
        for model in self.models:
            self.generate(model)

    def run(self) -> None:
        try:
            while not self.stop.wait(self.pause):
                self.generate(self._random.choice(self.models))
        except BaseException as exc:  # reported by the caller, not lost in the thread
            self.failures.append(exc)


class Ticker(threading.Thread):
    """A counter moved every ``period`` seconds: ``times[k]`` is just after it reached ``k + 1``, so a
    scrape that reads ``v`` was answered from a collection made before ``times[v]``."""

    def __init__(self, registry: CollectorRegistry, period: float = 0.005) -> None:
        super().__init__(name="test-ticks", daemon=True)
        self.counter = Counter(TICKS, "Ticks, counted by the test.", registry=registry)
        self.period = period
        self.times: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            self.counter.inc()
            self.times.append(time.monotonic())


@contextmanager
def serving_models(count: int, registry: CollectorRegistry) -> Iterator[tuple[Generating, Ticker]]:
    """``count`` models (:func:`build_models`) on ``registry`` while one of them generates now and then and
    a :class:`Ticker` dates the collections; both threads stopped and the models uninstrumented after."""
    models, handles = build_models(count, registry)
    generating = Generating(models)
    generating.warm()
    ticker = Ticker(registry)
    ticker.start()
    generating.start()
    try:
        yield generating, ticker
    finally:
        generating.stop.set()
        ticker.stop.set()
        generating.join(30)
        ticker.join(5)
        for handle in handles:
            handle.remove()


@dataclass
class Scrape:
    sent: float
    received: float
    ticks: int
    stated_age: float
    size: int
    models: int  # distinct model labels in llm_requests_total
    min_age: float = 0.0  # measured once the run is over (:func:`measure_ages`)

    @property
    def latency(self) -> float:
        return self.received - self.sent


@dataclass
class Scraper:
    """A Prometheus-like client (OpenMetrics preferred, gzip, one kept-alive connection) scraping ``port``
    every ``period`` seconds."""

    port: int
    period: float = 1.0
    scrapes: list[Scrape] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        for answer in scrape_every(self.port, self.period, until, dict(PROMETHEUS_HEADERS)):
            if isinstance(answer, str):
                self.errors.append(answer)
                continue
            text = answer.body.decode()
            found = _TICKS_SAMPLE.search(text)
            stated = answer.headers.get(AGE_HEADER)
            if answer.status != 200 or found is None or stated is None:
                self.errors.append(f"HTTP {answer.status}, ticks: {found is not None}, age: {stated}")
                continue
            models = len(set(re.findall(r'^llm_requests_total\{model="([^"]*)"', text, re.MULTILINE)))
            self.scrapes.append(
                Scrape(
                    answer.sent,
                    answer.received,
                    int(float(found[1])),
                    float(stated),
                    len(answer.body),
                    models,
                )
            )


def measure_ages(scrapes: list[Scrape], times: list[float]) -> None:
    """Each scrape's age when its client had it, at least: its collection was made before the tick that
    took the counter past what it read."""
    for scrape in scrapes:
        if scrape.ticks < len(times):
            scrape.min_age = max(0.0, scrape.received - times[scrape.ticks])


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile, interpolated between the two nearest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def series_count(text: str) -> int:
    """Series in an exposition: its sample lines."""
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def scrape_from_another_process(port: int, seconds: float, period: float = 1.0) -> Scraper:
    """A :class:`Scraper` of ``port`` for ``seconds``, run in a process of its own; its scrapes and errors.
    The monotonic clock is the system's, so its times compare with this process's."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.manymodels", str(port), str(seconds), str(period)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    found = json.loads(done.stdout)
    scraper = Scraper(port, period, errors=found["errors"])
    scraper.scrapes = [Scrape(**scrape) for scrape in found["scrapes"]]
    return scraper


if __name__ == "__main__":
    port, seconds, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    scraper = Scraper(port, period)
    scraper.run(seconds)
    print(json.dumps({"scrapes": [dataclasses.asdict(s) for s in scraper.scrapes], "errors": scraper.errors}))
