"""The request timeline's arithmetic on its own: the same times give the same observations whichever path
placed them (one step at a time, or a compiled run's steps together)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for
from inferwatch.instrumentation.metrics.observations import Observations
from inferwatch.instrumentation.timing.timeline import TokenTimeline


def observed(registry: CollectorRegistry, name: str) -> tuple[float, float]:
    """(count, sum) of histogram ``name`` of model m (end-to-end latency: of the served requests)."""
    labels = {"model": "m", "outcome": "ok"} if name == "llm_e2e_request_latency_seconds" else {"model": "m"}
    count = registry.get_sample_value(f"{name}_count", labels) or 0.0
    total = registry.get_sample_value(f"{name}_sum", labels) or 0.0
    return count, total


def served(place) -> CollectorRegistry:
    """A request that arrived at 1.0, began its prefill at 1.5 and placed its tokens with ``place``."""
    registry = CollectorRegistry()
    series = series_for(metrics_for(registry, InstrumentConfig()), "m")
    timeline = TokenTimeline(1.0, 1.0)
    observations = Observations()
    timeline.start_prefill(1.5, series, observations)
    place(timeline, series, observations)
    timeline.observe_end("ok", 4.0, series, observations)
    timeline.observe_decode(series, observations)
    observations.flush()
    return registry


ENDS = [2.0, 2.1, 2.3, 2.35, 3.0]


def test_a_compiled_runs_steps_observe_what_the_same_steps_one_by_one_do() -> None:
    def one_by_one(timeline, series, observations) -> None:
        for end in ENDS:
            timeline.place(end, 1, series, observations)

    def as_a_run(timeline, series, observations) -> None:
        timeline.place_steps(ENDS, series, observations)

    names = (
        "llm_time_to_first_token_seconds",
        "llm_request_prefill_seconds",
        "llm_request_queue_seconds",
        "llm_inter_token_latency_seconds",
        "llm_request_decode_seconds",
        "llm_request_time_per_output_token_seconds",
        "llm_request_max_inter_token_latency_seconds",
        "llm_e2e_request_latency_seconds",
    )
    first, second = served(one_by_one), served(as_a_run)
    for name in names:
        assert observed(first, name) == pytest.approx(observed(second, name)), name
    assert observed(first, "llm_time_to_first_token_seconds") == (1, pytest.approx(1.0))
    assert observed(first, "llm_request_prefill_seconds") == (1, pytest.approx(0.5))
    assert observed(first, "llm_request_queue_seconds") == (1, pytest.approx(0.5))
    assert observed(first, "llm_inter_token_latency_seconds") == (4, pytest.approx(1.0))
    assert observed(first, "llm_request_max_inter_token_latency_seconds") == (1, pytest.approx(0.65))
    assert observed(first, "llm_request_time_per_output_token_seconds") == (1, pytest.approx(0.25))
    assert observed(first, "llm_e2e_request_latency_seconds") == (1, pytest.approx(3.0))


def test_a_step_of_k_tokens_is_k_latencies_of_a_kth_of_its_gap() -> None:
    def speculative(timeline, series, observations) -> None:
        timeline.place(2.0, 1, series, observations)
        timeline.place(2.6, 3, series, observations)

    registry = served(speculative)
    assert observed(registry, "llm_inter_token_latency_seconds") == (3, pytest.approx(0.6))
    assert observed(registry, "llm_request_max_inter_token_latency_seconds") == (1, pytest.approx(0.6))
    assert observed(registry, "llm_request_time_per_output_token_seconds") == (1, pytest.approx(0.6 / 3))


def test_a_failed_request_counts_its_outcome_and_no_latency() -> None:
    registry = CollectorRegistry()
    series = series_for(metrics_for(registry, InstrumentConfig()), "m")
    observations = Observations()
    TokenTimeline(1.0, None).observe_end("error", 2.0, series, observations)
    observations.flush()
    assert registry.get_sample_value("llm_requests_total", {"model": "m", "status": "error"}) == 1
    assert observed(registry, "llm_e2e_request_latency_seconds") == (0, 0)


def test_what_was_sampled_after_the_last_delivery_is_wasted_also_when_placed_before_the_cancel() -> None:
    """Behind the HTTP edge the client's leaving is known after some of its tokens were placed (they
    resolve asynchronously, and the server notices late): those sampled after the last chunk sent count as
    wasted with the ones placed later, in steps one by one and in a compiled run's steps alike."""
    series = series_for(metrics_for(CollectorRegistry(), InstrumentConfig()), "m")
    for place_steps in (False, True):
        timeline, observations = TokenTimeline(1.0, 1.0), Observations()
        timeline.watched_by_edge()
        if place_steps:
            timeline.place_steps(ENDS[:4], series, observations)
        else:
            for end in ENDS[:4]:
                timeline.place(end, 1, series, observations)
        timeline.cancel_at(2.2)  # the last chunk was sent at 2.2: the tokens of 2.3 and 2.35 never left
        assert timeline.wasted_steps == 2
        timeline.place(ENDS[4], 1, series, observations)
        assert timeline.wasted_steps == 3
