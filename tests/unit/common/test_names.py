"""inferwatch.common.names is the one spelling of every metric name alerts, dashboards and the monitor
read: each name is a metric the instrumentation or the exporter really has, and no reader spells one
itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from inferwatch.common import names
from inferwatch.instrumentation.metrics.catalogue import CATALOGUE
from tests.support import REPO_ROOT, documented_metrics

# Series Prometheus makes itself for every scrape target.
PROMETHEUS_SERIES = {"up"}
READERS = ("alerts", "dashboards", "monitor")
_WORD = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _names() -> dict[str, str]:
    return {key: value for key, value in vars(names).items() if key.isupper()}


def test_each_constant_is_its_metric_name_in_capitals() -> None:
    assert _names()
    for key, value in _names().items():
        assert key == value.upper(), key


def test_each_name_is_a_metric_of_the_instrumentation_or_the_exporter() -> None:
    instrumentation = {spec.name for spec in CATALOGUE}
    # docs/metrics.md's exporter section is what the exporter exposes (tests/unit/exporter keeps it so).
    exporter = set(documented_metrics("Exporter"))
    for key, value in _names().items():
        if value.startswith("llm_"):
            assert value in instrumentation, f"{key}: not in inferwatch.instrumentation.metrics.catalogue"
        else:
            assert value in exporter | PROMETHEUS_SERIES, f"{key}: not in docs/metrics.md's exporter section"


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal but docstrings, f-string parts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and ast.get_docstring(node) is not None
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_readers_spell_no_metric_name_themselves() -> None:
    # "up" is also an English word; the readers' own "up" is checked by the rules' and panels' tests.
    metrics = set(documented_metrics("Instrumentation")) | set(documented_metrics("Exporter"))
    spelled = []
    for reader in READERS:
        for path in sorted((REPO_ROOT / reader).rglob("*.py")):
            for line, text in _string_literals(path):
                words = {re.sub(r"_(sum|count|bucket)$", "", word) for word in _WORD.findall(text)}
                spelled += [
                    f"{path.relative_to(REPO_ROOT)}:{line}: {word}" for word in sorted(words & metrics)
                ]
    assert spelled == [], "write these as inferwatch.common.names constants"
