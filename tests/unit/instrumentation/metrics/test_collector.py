"""The catalogue's one collector (metrics/collector.py) and the prerendered families it yields
(common/prerendered.py): every exposition byte for byte what prometheus_client's own collection and
encoders write of the same families without ``_created``, in every format and escaping, after values move,
children come and go, through the helper's frames and with ``name[]``."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from inferwatch.common.frames import pack_families, unpack_families
from inferwatch.common.prerendered import PrerenderedFamily, encode_families
from inferwatch.instrumentation import InstrumentConfig
from inferwatch.instrumentation.endpoint.rendering import Collected, restricted
from inferwatch.instrumentation.metrics.catalogue import CATALOGUE, Metrics, metrics_for

ACCEPTS = [
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=2.0.0",
    "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=values",
]
# Label values an encoder must escape (quote, backslash, newline), non-ASCII, empty.
MODELS = ['quote"back\\slash\nnewline', "modèle-ü", ""]


def _label_value(label: str, model: str, index: int) -> str:
    return model if label == "model" else f"{label}-{index}"


def _populate(metrics: Metrics, step: int) -> None:
    """Every family of the catalogue with a child per model, its values moved by ``step``."""
    for spec in CATALOGUE:
        family = metrics[spec]
        for index, model in enumerate(MODELS):
            child = family.labels(*[_label_value(label, model, index) for label in spec.labels])
            if spec.type == "counter":
                child.inc(step * (index + 1))
            elif spec.type == "gauge":
                child.set(step * 0.1 + index * 1e9)
            else:
                for value in (0.0001 * step, 0.3 * (index + 1), 7.0 * step, 1e7):
                    child.observe(value)


class _Reference:
    """prometheus_client's own collection of the catalogue's families (each family's ``collect()``, what
    registering it would serve), without ``_created``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        out = []
        for spec in CATALOGUE:
            for family in self._metrics[spec].collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                out.append(family)
        return out


@pytest.fixture
def metrics() -> Metrics:
    return metrics_for(CollectorRegistry(), InstrumentConfig())


def _assert_identical(metrics: Metrics) -> list[Metric]:
    collected = list(metrics.registry.collect())  # the collector (and the oldest-age refresh) first
    assert all(isinstance(family, PrerenderedFamily) for family in collected)
    reference = _Reference(metrics)
    shipped = unpack_families(pack_families(collected, lines=True), trusted=True)
    assert all(isinstance(family, PrerenderedFamily) and not family._samples for family in shipped)
    for accept in ACCEPTS:
        encoder, _ = choose_encoder(accept)
        expected = encoder(reference)
        assert encode_families(encoder, collected) == expected, accept
        # The helper's copy (the lines, their samples parsed back where an escaping needs them).
        assert (
            encode_families(encoder, unpack_families(pack_families(collected, lines=True), trusted=True))
            == expected
        ), accept
        # Any other reader of samples (generate_latest on the registry, the program's hub).
        assert encoder(Collected(collected)) == expected, accept
        assert encoder(Collected(unpack_families(pack_families(collected)))) == expected, accept
    return collected


def test_every_format_is_what_prometheus_client_writes(metrics: Metrics) -> None:
    _populate(metrics, 1)
    collected = _assert_identical(metrics)
    text = generate_latest(metrics.registry).decode()
    assert "_created" not in text
    assert 'model="quote\\"back\\\\slash\\nnewline"' in text and 'model="modèle-ü"' in text
    assert len(collected) == len(CATALOGUE)


def test_moved_values_and_new_and_removed_children_are_served(metrics: Metrics) -> None:
    _populate(metrics, 1)
    first = generate_latest(metrics.registry)
    _populate(metrics, 2)
    second = generate_latest(metrics.registry)
    assert second != first
    _assert_identical(metrics)
    # A new model's children, one removed model's gauges.
    for spec in CATALOGUE:
        family = metrics[spec]
        family.labels(*[_label_value(label, "late", 9) for label in spec.labels])
        if spec.type == "gauge":
            family.remove(*[_label_value(label, MODELS[1], 1) for label in spec.labels])
    text = generate_latest(metrics.registry).decode()
    assert 'model="late"' in text
    assert 'llm_requests_running{model="modèle-ü"}' not in text
    _assert_identical(metrics)
    # Unchanged values: the same lines again (not formatted anew).
    again = [family.lines for family in metrics.registry.collect()]
    assert again == [family.lines for family in metrics.registry.collect()]


def test_name_restriction_is_prometheus_client_s(metrics: Metrics) -> None:
    _populate(metrics, 3)
    collected = list(metrics.registry.collect())
    names = frozenset(
        {"llm_requests_total", "llm_time_to_first_token_seconds_bucket", "llm_batch_size_sum", "llm_none"}
    )
    for accept in ACCEPTS:
        encoder, _ = choose_encoder(accept)
        expected = encoder(Collected(restricted(list(_Reference(metrics).collect()), names)))
        assert encode_families(encoder, restricted(collected, names)) == expected, accept
    assert restricted(collected, frozenset({"llm_none"})) == []


def test_a_mixed_collection_keeps_the_order_and_the_plain_families() -> None:
    registry = CollectorRegistry()
    Counter("llm_test_events", "Events.", ["model"], registry=registry).labels("a").inc()
    Gauge("llm_test_level", "Level.", unit="bytes", registry=registry).set(5)
    Histogram("llm_test_seconds", "Times.", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    plain = list(registry.collect())
    for family in plain:
        family.samples = [s for s in family.samples if not s.name.endswith("_created")]
    # The middle one prerendered from its own samples' lines.
    lines = generate_latest(Collected([plain[1]])).split(b"\n", 2)[2]
    mixed = [
        plain[0],
        PrerenderedFamily(plain[1].name, plain[1].documentation, "gauge", "bytes", lines),
        plain[2],
    ]
    for accept in ACCEPTS:
        encoder, _ = choose_encoder(accept)
        assert encode_families(encoder, mixed) == encoder(Collected(plain)), accept
    # Its samples, parsed back from the lines where nothing made them.
    assert mixed[1].samples == plain[1].samples
    # As the endpoint's helper gets it: the lines as they were.
    assert unpack_families(pack_families([mixed[1]], lines=True), trusted=True)[0].lines == lines


def test_a_child_with_its_own_samples_is_read_through_them(metrics: Metrics) -> None:
    """A child whose sample method was replaced (``Gauge.set_function``) is not read by layout."""
    _populate(metrics, 1)
    family = metrics[CATALOGUE[[spec.type for spec in CATALOGUE].index("gauge")]]
    labels = [_label_value(label, "fn", 5) for label in family._labelnames]
    value = [100.0]
    family.labels(*labels).set_function(lambda: value[0])
    first = _assert_identical(metrics)
    value[0] = 101.0
    second = _assert_identical(metrics)
    assert [f.lines for f in first] != [f.lines for f in second]
