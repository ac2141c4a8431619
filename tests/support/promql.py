"""Metric names in a PromQL expression, for the tests that check rules and dashboards name real metrics.

Not a parser: it drops what is not a metric name (strings, label matchers, grouping clauses, ranges,
Grafana variables, function calls, keywords, numbers) and keeps the identifiers that remain, which in the
expressions this project writes are exactly the selected series.
"""

from __future__ import annotations

import re

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"inf", "nan", "Inf", "NaN"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACES = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\w)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Names of the series ``expr`` selects (recording rule names included)."""
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        names.add(name)
    return names


def base_metric(name: str, documented: set[str]) -> str:
    """The documented family a series name belongs to: histogram series carry a suffix."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in documented:
            return name.removesuffix(suffix)
    return name
