"""llm_request_oldest_running_age_seconds: the age of a model's oldest running request, computed when the
registry is scraped from the running requests' start times.

The set itself is driven with explicit perf_counter values; real requests (a tracked one, a tiny model's
generate held in a stopping criterion, continuous batching's manager) are checked against the times the
test took itself around them: a request cannot have started before the test started it, nor after the
test saw it run, and a scrape reads the clock between the test's readings before and after it.
"""

from __future__ import annotations

import gc
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from inferwatch.instrumentation import instrument, track_request
from inferwatch.instrumentation.batching.batch_timeline import BatchTimeline
from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.demo.models import build_model, encode_text
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import ModelSeries, forget_series, series_for
from inferwatch.instrumentation.timing.request import Request
from tests.support.batching import small_page_pool
from tests.unit.instrumentation.conftest import batch_of

pytestmark = pytest.mark.matrix

AGE = "llm_request_oldest_running_age_seconds"
RUNNING = "llm_requests_running"


def value(registry: CollectorRegistry, name: str, model: str) -> float | None:
    """One sample, through a collection of the registry (which runs the scrape-time callbacks)."""
    return registry.get_sample_value(name, {"model": model})


def timed_age(registry: CollectorRegistry, model: str) -> tuple[float, float, float]:
    """(perf_counter before the scrape, the age it read, perf_counter after it)."""
    before = time.perf_counter()
    age = value(registry, AGE, model)
    after = time.perf_counter()
    assert age is not None
    return before, age, after


def fresh_series(name: str = "m") -> tuple[CollectorRegistry, ModelSeries]:
    registry = CollectorRegistry()
    return registry, series_for(metrics_for(registry, InstrumentConfig()), name)


def gauge_value(gauge) -> float:
    """A child's value without a collection (no scrape-time refresh)."""
    return gauge._value.get()


# -- the set ---------------------------------------------------------------------------------------------


def test_the_age_is_that_of_the_oldest_running_request() -> None:
    _, series = fresh_series()
    series.refresh_running_age(now=500.0)
    assert gauge_value(series.oldest_running_age) == 0.0  # none runs: 0, not absent
    series.begin_running("b", 120.0)
    series.begin_running("a", 100.0)  # arrived earlier, began running later (a queue)
    series.begin_running("c", 130.0)
    series.refresh_running_age(now=150.0)
    assert gauge_value(series.oldest_running_age) == 50.0
    assert gauge_value(series.running) == 3
    series.end_running("a")
    series.refresh_running_age(now=160.0)
    assert gauge_value(series.oldest_running_age) == 40.0  # b is the oldest now
    series.end_running("b")
    series.end_running("c")
    series.refresh_running_age(now=170.0)
    assert gauge_value(series.oldest_running_age) == 0.0
    assert gauge_value(series.running) == 0


def test_a_key_counts_once_and_an_unknown_end_changes_nothing() -> None:
    _, series = fresh_series()
    series.begin_running(1, 10.0)
    series.begin_running(1, 20.0)  # already running: neither counted again nor made younger
    series.refresh_running_age(now=30.0)
    assert (gauge_value(series.running), gauge_value(series.oldest_running_age)) == (1, 20.0)
    series.end_running(1)
    series.end_running(1)
    series.end_running("never began")
    assert gauge_value(series.running) == 0  # never below zero


def test_a_start_in_the_future_of_the_reading_is_age_zero() -> None:
    _, series = fresh_series()
    series.begin_running("k", 100.0)
    series.refresh_running_age(now=99.0)
    assert gauge_value(series.oldest_running_age) == 0.0


def test_every_scrape_computes_the_age_afresh() -> None:
    registry, series = fresh_series()
    assert value(registry, AGE, "m") == 0.0  # the series exists from the model's first use
    since = time.perf_counter() - 100.0  # began 100 s ago
    series.begin_running("k", since)
    for _ in range(2):
        before, age, after = timed_age(registry, "m")
        assert before - since <= age <= after - since
    series.end_running("k")
    assert value(registry, AGE, "m") == 0.0
    assert value(registry, RUNNING, "m") == 0


def test_concurrent_starts_ends_and_scrapes_leave_nothing_behind() -> None:
    registry, series = fresh_series()
    stop = threading.Event()

    def serve(worker: int) -> None:
        for i in range(500):
            key = (worker, i)
            series.begin_running(key, time.perf_counter())
            series.end_running(key)

    def scrape() -> None:
        while not stop.is_set():
            assert value(registry, AGE, "m") >= 0.0

    scraper = threading.Thread(target=scrape)
    scraper.start()
    workers = [threading.Thread(target=serve, args=(w,)) for w in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    scraper.join()
    assert value(registry, RUNNING, "m") == 0
    assert value(registry, AGE, "m") == 0.0
    assert series._running_since == {}


def test_a_forgotten_model_drops_the_age_series() -> None:
    registry, series = fresh_series("gone")
    series.begin_running("k", time.perf_counter())
    assert value(registry, AGE, "gone") is not None
    forget_series(series.metrics, "gone", [])
    assert value(registry, AGE, "gone") is None
    assert value(registry, RUNNING, "gone") is None


def test_multiprocess_mode_writes_the_age_when_the_process_has_a_reason_to(monkeypatch) -> None:
    """No scrape reaches a worker in multiprocess mode: starts, ends and heartbeats write the value (the
    poller's polls too). The variable is set after prometheus_client chose its values, so they stay in
    memory here; test_multiprocess.py runs real worker processes."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")
    _, series = fresh_series()
    since = time.perf_counter() - 50.0
    series.begin_running("k", since)
    written = gauge_value(series.oldest_running_age)
    assert 50.0 <= written <= time.perf_counter() - since
    series._last_beat = 0.0
    series.heartbeat()
    assert gauge_value(series.oldest_running_age) >= written
    series.end_running("k")
    assert gauge_value(series.oldest_running_age) == 0.0


# -- real requests ---------------------------------------------------------------------------------------


def test_a_tracked_request_ages_from_its_arrival_and_holds_no_reference() -> None:
    registry = CollectorRegistry()
    arrival = time.perf_counter() - 30.0  # reached the server 30 s ago, say
    with track_request(model_name="hand", registry=registry, arrival=arrival) as req:
        req.token()
        before, age, after = timed_age(registry, "hand")
        assert before - arrival <= age <= after - arrival
        series = series_for(metrics_for(registry, InstrumentConfig()), "hand")
        held = gc.get_referents(series._running_since)
        assert not any(isinstance(obj, Request) for obj in held)
        assert all(type(since) is float for since in series._running_since.values())
    assert value(registry, AGE, "hand") == 0.0


class Hold(StoppingCriteria):
    """Blocks generate at its first token until the test releases it: the request runs as long as the
    test wants, deterministically."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.reached_at = 0.0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        if not self.reached.is_set():
            self.reached_at = time.perf_counter()
            self.reached.set()
            assert self.release.wait(30)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def test_a_generate_that_does_not_end_ages_with_the_clock(llama, instrumented, registry) -> None:
    instrumented(llama, model_name="held")
    ids, mask = batch_of("a request with max_tokens=10**9")
    hold = Hold()
    started: list[float] = []
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            started.append(time.perf_counter())
            llama.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=4,
                min_new_tokens=4,
                do_sample=False,
                stopping_criteria=StoppingCriteriaList([hold]),
            )
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert hold.reached.wait(30)
        # The request entered generate after `started` and before the criterion was reached.
        first = timed_age(registry, "held")
        time.sleep(0.3)
        second = timed_age(registry, "held")
        for before, age, after in (first, second):
            assert before - hold.reached_at <= age <= after - started[0]
        # It grew by the time between the scrapes, as the test measured it.
        assert second[0] - first[2] <= second[1] - first[1] <= second[2] - first[0]
        assert value(registry, RUNNING, "held") == 1
    finally:
        hold.release.set()
        thread.join(30)
    assert not failures
    assert value(registry, AGE, "held") == 0.0
    assert value(registry, RUNNING, "held") == 0


def test_continuous_batching_a_long_request_ages_until_it_is_cancelled() -> None:
    registry = CollectorRegistry()
    model = build_model("tiny-llama")
    handle = instrument(model, model_name="cb-age", registry=registry)
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(max_new_tokens=5000, do_sample=False, eos_token_id=-1),
        continuous_batching_config=small_page_pool(),
    )
    manager.start()
    try:
        added = time.perf_counter()
        request_id = manager.add_request(encode_text("a long story"), max_new_tokens=5000, streaming=True)
        outputs = manager.request_id_iter(request_id)
        next(outputs)
        seen = time.perf_counter()  # it has run by now (and began no earlier than `added`)
        first = timed_age(registry, "cb-age")
        time.sleep(0.2)
        second = timed_age(registry, "cb-age")
        for before, age, after in (first, second):
            assert before - seen <= age <= after - added
        assert second[0] - first[2] <= second[1] - first[1] <= second[2] - first[0]
        assert value(registry, RUNNING, "cb-age") == 1
        manager.cancel_request(request_id)  # on this thread: the request leaves the running set now
        assert value(registry, AGE, "cb-age") == 0.0
        assert value(registry, RUNNING, "cb-age") == 0
    finally:
        manager.stop(block=True)
        handle.flush()
        handle.remove()


def test_a_requeued_request_stops_ageing_until_it_runs_again() -> None:
    """Preemption (BatchTimeline.requeue) takes a request out of the running set; scheduled again, it
    ages from its arrival once more."""
    registry, series = fresh_series("cb")
    model = SimpleNamespace(series=series, errors=series.errors, placement=SimpleNamespace(clock=None))
    timeline = BatchTimeline(model)
    arrival = time.perf_counter() - 20.0
    timeline.arrive("r1", arrival, arrival, prompt=3)
    future = SimpleNamespace(
        state=SimpleNamespace(request_id="r1", generated_tokens=[], position_offset=0),
        query_length=3,
        has_new_token=True,
    )
    timeline.compose([future])
    before, age, after = timed_age(registry, "cb")
    assert before - arrival <= age <= after - arrival
    timeline.requeue(SimpleNamespace(request_id="r1"))
    assert value(registry, AGE, "cb") == 0.0
    assert value(registry, RUNNING, "cb") == 0
    assert value(registry, "llm_requests_waiting", "cb") == 1
    timeline.compose([future])
    before, age, after = timed_age(registry, "cb")
    assert before - arrival <= age <= after - arrival
    timeline.cancel("r1")
    assert value(registry, AGE, "cb") == 0.0
    assert value(registry, RUNNING, "cb") == 0


def test_the_family_is_a_livemax_gauge_in_seconds() -> None:
    spec = cat.OLDEST_RUNNING_AGE
    assert (spec.type, spec.unit, spec.labels) == ("gauge", "seconds", ("model",))
    assert spec.multiprocess_mode == "livemax"  # the oldest of every worker's oldest; dead workers leave
