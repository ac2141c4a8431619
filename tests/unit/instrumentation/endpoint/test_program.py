"""The program's endpoint: processes' collections merged as one program's, and what a gone process leaves."""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from inferwatch.common.frames import frame
from inferwatch.instrumentation.endpoint.program import (
    ProgramCollector,
    ProgramHub,
    _PeerAgent,
    merge_families,
)
from tests.support import sample_value
from tests.support.services import wait_until


def _process_registry(requests: float, running: float, step: float) -> CollectorRegistry:
    """A registry as one process of a program has it: a counter, a histogram, gauges of two modes."""
    registry = CollectorRegistry()
    Counter("llm_requests", "", ["model"], registry=registry).labels("m").inc(requests)
    Histogram("llm_e2e_request_latency_seconds", "", ["model"], buckets=(1.0,), registry=registry).labels(
        "m"
    ).observe(0.5)
    Gauge("llm_requests_running", "", ["model"], registry=registry).labels("m").set(running)
    Gauge("llm_last_step_timestamp_seconds", "", ["model"], registry=registry).labels("m").set(step)
    return registry


def _text(families: list[Metric]) -> str:
    class Fixed:
        def collect(self) -> list[Metric]:
            return families

    registry = CollectorRegistry()
    registry.register(Fixed())
    return generate_latest(registry).decode()


def test_merge_sums_counts_and_combines_gauges_by_their_catalogue_mode() -> None:
    merged = _text(
        merge_families([_process_registry(3, 1, 100.0).collect(), _process_registry(4, 2, 250.0).collect()])
    )
    assert sample_value(merged, "llm_requests_total", model="m") == 7
    assert sample_value(merged, "llm_e2e_request_latency_seconds_count", model="m") == 2
    assert sample_value(merged, "llm_e2e_request_latency_seconds_bucket", model="m", le="1.0") == 2
    assert sample_value(merged, "llm_requests_running", model="m") == 3  # livesum
    assert sample_value(merged, "llm_last_step_timestamp_seconds", model="m") == 250.0  # livemax


def test_a_series_of_one_process_is_passed_on_as_it_is() -> None:
    only = CollectorRegistry()
    Gauge("llm_kv_cache_bytes", "", ["model"], registry=only).labels("m").set(4096)
    merged = _text(merge_families([only.collect(), _process_registry(1, 0, 1.0).collect()]))
    assert sample_value(merged, "llm_kv_cache_bytes", model="m") == 4096
    assert sample_value(merged, "llm_requests_total", model="m") == 1


def _scrape(collector: ProgramCollector) -> str:
    return _text(collector.collect())


def test_peers_are_merged_and_a_dead_one_keeps_its_counts_not_its_gauges() -> None:
    hub = ProgramHub()
    try:
        owner = _process_registry(1, 0, 10.0)
        collector = ProgramCollector(hub, owner)
        engine = _PeerAgent(hub.address, "engine", registry=_process_registry(5, 2, 20.0))
        api = _PeerAgent(hub.address, "api", registry=_process_registry(0, 0, 5.0))
        wait_until(
            lambda: sample_value(_scrape(collector), "inferwatch_run_processes", role="api") == 1,
            timeout=10,
            what="both peers on the hub",
        )
        body = _scrape(collector)
        assert sample_value(body, "llm_requests_total", model="m") == 6
        assert sample_value(body, "llm_requests_running", model="m") == 2
        assert sample_value(body, "inferwatch_run_processes", role="engine") == 1

        engine._sock.shutdown(socket.SHUT_RDWR)  # as a SIGKILL leaves it: no goodbye
        engine._sock.close()
        body = wait_until(
            lambda: (
                b
                if sample_value(b := _scrape(collector), "inferwatch_run_processes", role="engine") == 0
                else None
            ),
            timeout=10,
            what="the dead engine retired",
        )
        assert sample_value(body, "llm_requests_total", model="m") == 6  # counts kept
        assert sample_value(body, "llm_e2e_request_latency_seconds_count", model="m") == 3
        assert sample_value(body, "llm_requests_running", model="m") == 0  # its 2 running are gone
        assert sample_value(body, "inferwatch_run_process_exits_total", role="engine", how="died") == 1

        api._goodbye()
        api._sock.close()
        body = wait_until(
            lambda: (
                b
                if sample_value(b := _scrape(collector), "inferwatch_run_process_exits_total", how="exited")
                else None
            ),
            timeout=10,
            what="the api process's goodbye",
        )
        assert sample_value(body, "inferwatch_run_process_exits_total", role="api", how="exited") == 1
        assert sample_value(body, "llm_requests_total", model="m") == 6
    finally:
        hub.close()


def test_a_peer_that_does_not_answer_in_time_is_served_from_its_last_collection() -> None:
    hub = ProgramHub()
    try:
        collector = ProgramCollector(hub, CollectorRegistry())
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect("\0" + hub.address)
        silent.sendall(frame({"op": "hello", "pid": 1, "role": "worker"}))
        wait_until(
            lambda: sample_value(_scrape(collector), "inferwatch_run_processes", role="worker") == 1,
            timeout=10,
            what="the silent peer on the hub",
        )
        body = _scrape(collector)
        assert sample_value(body, "inferwatch_run_late_collections_total", role="worker") >= 1
        assert sample_value(body, "inferwatch_run_processes", role="worker") == 1  # slow is not dead
        silent.close()
    finally:
        hub.close()
