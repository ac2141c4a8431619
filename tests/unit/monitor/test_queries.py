"""Every metric and label the monitor reads is one docs/metrics.md documents (so one the code exposes)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from inferwatch.common.promql import Selector
from inferwatch.monitor import queries
from tests.support import METRICS_DOC

# Labels that come from the scrape (Prometheus's target labels), not from the exporting code.
SCRAPE_LABELS = {"job", "instance"}
_ROW = re.compile(
    r"^\|\s*`(?P<name>[a-z_:][a-z0-9_:]*)`\s*\|\s*(?P<type>[a-z]+)\s*\|[^|]*\|(?P<labels>[^|]*)\|"
)


def documented() -> dict[str, set[str]]:
    """Documented metric -> its labels."""
    out = {}
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            out[match["name"]] = {
                label.strip(" `") for label in match["labels"].split(",") if label.strip(" `")
            }
    return out


def used() -> Iterator[tuple[str, set[str], object]]:
    """(metric, labels it is matched or grouped on, expression) for every expression in queries."""

    def walk(node: object, by: set[str]) -> Iterator[tuple[str, set[str]]]:
        if isinstance(node, Selector):
            yield node.metric, by | {matcher.name for matcher in node.matchers}
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            labels = set(getattr(node, "by", ()))
            for field in dataclasses.fields(node):
                yield from walk(getattr(node, field.name), by | labels)

    for name, value in vars(queries).items():
        if name.isupper():
            for metric, labels in walk(value, set()):
                yield metric, labels, name


def test_every_metric_and_label_is_documented() -> None:
    docs = documented()
    for metric, labels, expression in used():
        base = re.sub(r"_(sum|count|bucket)$", "", metric)
        name = metric if metric in docs else base
        assert name in docs, f"{expression} reads {metric}, which docs/metrics.md does not list"
        missing = labels - docs[name] - SCRAPE_LABELS
        assert not missing, f"{expression} uses labels {missing} that {name} does not have"
