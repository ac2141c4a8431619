"""Scrape rendering: both exposition formats, and a cached encoding that is never stale."""

from __future__ import annotations

from typing import Any

from inferwatch.exporter.exposition import Exposition, wants_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.support import sample_value
from tests.unit.exporter.conftest import MakePoller

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def test_openmetrics_is_negotiated_like_prometheus_asks_for_it() -> None:
    prometheus = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    )
    assert wants_openmetrics(prometheus + "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert not wants_openmetrics("text/plain;version=0.0.4,application/openmetrics-text")
    assert not wants_openmetrics(None)
    assert not wants_openmetrics("*/*")


def test_openmetrics_is_one_valid_document_with_the_exporters_own_process(make_poller: MakePoller) -> None:
    poller = make_poller()
    poller.collect()
    body, content_type = Exposition(poller).render(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    text = body.decode()
    assert text.count("# EOF") == 1 and text.endswith("# EOF\n")
    names = {family.name for family in parse_openmetrics(text)}
    assert {"gpu_up", "gpu_energy_joules", "process_resident_memory_bytes"} <= names


def test_the_cached_encoding_follows_every_change(make_poller: MakePoller, fake: Any) -> None:
    poller = make_poller()
    poller.collect()
    exposition = Exposition(poller)

    def errors() -> float | None:
        text = exposition.render(None)[0].decode()
        return sample_value(text, "inferwatch_exporter_nvml_errors_total", call="nvmlDeviceGetName")

    assert errors() is None
    poller.nvml_errors.add("nvmlDeviceGetName", "unknown")  # a live count, between two collections
    assert errors() == 1
    before = exposition.render(None)[0]
    fake.command("lose", gpu=0)
    poller.collect()
    after = exposition.render(None)[0].decode()
    assert after != before.decode()
    assert sample_value(after, "gpu_up", gpu="0") == 0
