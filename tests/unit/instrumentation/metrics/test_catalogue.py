"""The metric catalogue: Prometheus conventions, docs/metrics.md in step, one set of families per registry."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import Gauge

from inferwatch.instrumentation import InstrumentConfig
from inferwatch.instrumentation.metrics.catalogue import CATALOGUE, metrics_for
from inferwatch.instrumentation.metrics.containment import STAGES
from tests.support import METRICS_DOC, PACKAGE_ROOT, documented_metrics

SECTION = "Instrumentation"


def _doc_rows() -> dict[str, list[str]]:
    rows, in_section = {}, False
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_section = line[3:].startswith(SECTION)
        elif in_section and line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_catalogue_follows_prometheus_conventions() -> None:
    names = [spec.name for spec in CATALOGUE]
    assert len(names) == len(set(names))
    for spec in CATALOGUE:
        assert re.fullmatch(r"llm_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.type == "counter"), spec.name
        assert spec.help.endswith("."), spec.name
        if spec.type == "histogram":
            assert spec.buckets in vars(InstrumentConfig()), spec.name
        if spec.type == "gauge":
            assert spec.multiprocess_mode in Gauge._MULTIPROC_MODES, spec.name
        for unit in ("seconds", "bytes", "ratio"):
            if spec.unit == unit:
                assert unit in spec.name, spec.name
        assert not {"request_id", "prompt", "pid"} & set(spec.labels), spec.name


def test_docs_list_exactly_the_catalogue() -> None:
    documented = documented_metrics(SECTION)
    assert documented == {spec.name: spec.type for spec in CATALOGUE}
    rows = _doc_rows()
    for spec in CATALOGUE:
        _, _, unit, labels, meaning = rows[spec.name]
        assert unit == spec.unit, spec.name
        assert labels == ", ".join(f"`{label}`" for label in spec.labels), spec.name
        if spec.multiprocess_mode:
            assert f"Multiprocess: `{spec.multiprocess_mode}`" in meaning, spec.name


def test_one_set_of_families_per_registry() -> None:
    registry = CollectorRegistry()
    first = metrics_for(registry, InstrumentConfig())
    assert metrics_for(registry, InstrumentConfig()) is first
    assert metrics_for(CollectorRegistry(), InstrumentConfig()) is not first
    exposed = {family.name for family in registry.collect()}
    assert exposed == {spec.name.removesuffix("_total") for spec in CATALOGUE}


def test_error_stages_are_a_documented_fixed_set() -> None:
    used = set()
    for path in (PACKAGE_ROOT / "instrumentation").rglob("*.py"):
        used |= set(re.findall(r'\.report\(\s*"(\w+)"', path.read_text(encoding="utf-8")))
    assert used and used <= set(STAGES)
    meaning = _doc_rows()["llm_instrumentation_errors_total"][4]
    for stage in STAGES:
        assert stage in meaning, stage
