"""Scrape rendering: both exposition formats, gzip, and a cached encoding that is never stale."""

from __future__ import annotations

import gzip
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from inferwatch.exporter.exposition import ScrapeRenderer
from tests.support import sample_value
from tests.unit.exporter.conftest import MakePoller

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def test_openmetrics_is_one_valid_document_with_the_exporters_own_process(make_poller: MakePoller) -> None:
    poller = make_poller()
    poller.collect()
    body = ScrapeRenderer(poller).render(OPENMETRICS)
    assert body.content_type.startswith("application/openmetrics-text") and not body.gzipped
    text = body.data.decode()
    assert text.count("# EOF") == 1 and text.endswith("# EOF\n")
    names = {family.name for family in parse_openmetrics(text)}
    assert {"gpu_up", "gpu_energy_joules", "process_resident_memory_bytes"} <= names


def test_the_cached_encoding_follows_every_change(make_poller: MakePoller, fake: Any) -> None:
    poller = make_poller()
    poller.collect()
    exposition = ScrapeRenderer(poller)

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


def test_each_variant_is_made_once_per_change_and_gzip_is_the_plain_body_compressed(
    make_poller: MakePoller,
) -> None:
    poller = make_poller()
    poller.collect()
    exposition = ScrapeRenderer(poller)
    plain = exposition.render(OPENMETRICS)
    compressed = exposition.render(OPENMETRICS, "gzip")
    assert compressed.gzipped and gzip.decompress(compressed.data) == plain.data
    assert exposition.render(OPENMETRICS, "gzip") is compressed  # served from memory
    assert exposition.render(OPENMETRICS, "gzip;q=0") is plain
    poller.collect()
    assert exposition.render(OPENMETRICS, "gzip") is not compressed
