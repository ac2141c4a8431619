"""The one duration parser: Prometheus's syntax for the alert configuration, and a superset of it for
command-line options (what the exporter's flags and ``inferwatch diagnose`` each accepted before)."""

from __future__ import annotations

import pytest

from inferwatch.common.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h", 3600), ("1d", 86400), ("2w", 14 * 86400),
        ("1y", 365 * 86400), ("1h30m", 5400), ("1m30s500ms", 90.5), ("0s", 0),
    ],
)  # fmt: skip
def test_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, promql=True) == seconds
    if seconds:
        assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1.5s", "3", "", "m", "30m1h", "1h1h", "5 m", " 5m", "-1s", "5M"])
def test_prometheus_refuses_what_it_would_not_parse(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text, promql=True)


@pytest.mark.parametrize(
    ("text", "seconds"), [("1.5s", 1.5), (".5h", 1800), ("2.", 2), ("3", 3), (" 2m ", 120), ("1.5h30m", 7200)]
)
def test_options_also_take_decimals_and_bare_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "-1s", "1e3", "5 minutes", "30m1h", "1d1d"])
def test_options_refuse_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match=f"^{text!r} is not a duration \\(examples: 500ms, 1s, 2m\\)$"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "0.0ms"])
def test_options_must_be_above_zero(text: str) -> None:
    with pytest.raises(ValueError, match=f"^{text!r} must be above zero$"):
        parse_duration(text)
