"""Content negotiation by ``q`` values (RFC 9110 12.5.1 and 12.5.3), as both metrics endpoints use it."""

from __future__ import annotations

import pytest

from inferwatch.common.negotiation import (
    OPENMETRICS,
    TEXT,
    NotAcceptable,
    choose_media_type,
    gzip_acceptable,
    prefers_openmetrics,
)

PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        (PROMETHEUS_2, True),
        (PROMETHEUS_3, True),
        # The weights decide, not the order.
        ("text/plain;version=0.0.4;q=0.5,application/openmetrics-text;q=0.9", True),
        ("application/openmetrics-text;q=0.3,text/plain;version=0.0.4;q=0.5", False),
        # q=0 is "not acceptable", even when listed first.
        ("application/openmetrics-text;q=0,text/plain", False),
        ("application/openmetrics-text;version=1.0.0;q=0, */*", False),
        # A specific entry overrides a range: text refused, OpenMetrics through */*.
        ("text/plain;q=0,*/*", True),
        ("text/*;q=0.2,application/*;q=0.8", True),
        # Equal weights: the one listed first; only ranges, or nothing: the text format.
        ("text/plain;version=0.0.4,application/openmetrics-text", False),
        ("application/openmetrics-text,text/plain", True),
        ("*/*", False),
        (None, False),
        ("", False),
        ("application/json", False),
        # Only the text format refused, OpenMetrics not named: the one not refused.
        ("text/plain;q=0", True),
        # Parameters and case do not confuse it; a malformed weight counts as 0.
        ("Application/OpenMetrics-Text ; version=1.0.0 ; Q=1, text/plain;q=0.5", True),
        ("application/openmetrics-text;q=high,text/plain;q=0.1", False),
    ],
)
def test_openmetrics_is_chosen_by_weight(accept: str | None, openmetrics: bool) -> None:
    assert prefers_openmetrics(accept) is openmetrics


def test_the_chosen_entry_keeps_its_parameters_without_q() -> None:
    assert choose_media_type(PROMETHEUS_3, (TEXT, OPENMETRICS)) == (
        OPENMETRICS,
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    )
    # Of two entries for one type, the heavier one.
    accept = "text/plain;version=0.0.4;q=0.2,text/plain;version=1.0.0;q=0.6"
    assert choose_media_type(accept, (TEXT, OPENMETRICS)) == (TEXT, "text/plain;version=1.0.0")
    # Chosen through a range: the bare type, so the encoder takes its default version.
    assert choose_media_type("*/*", (TEXT, OPENMETRICS)) == (TEXT, TEXT)
    # Named by nothing: the first offered type not refused, bare.
    assert choose_media_type("application/json", (TEXT, OPENMETRICS)) == (TEXT, TEXT)


@pytest.mark.parametrize(
    "accept",
    [
        "*/*;q=0",
        "application/openmetrics-text;q=0, text/plain;q=0, */*;q=0",
        "text/*;q=0, application/*;q=0",
        "text/plain;q=0, application/openmetrics-text;q=0",
    ],
)
def test_every_format_refused_is_not_acceptable(accept: str) -> None:
    with pytest.raises(NotAcceptable, match="text/plain, application/openmetrics-text"):
        choose_media_type(accept, (TEXT, OPENMETRICS))
    with pytest.raises(NotAcceptable):
        prefers_openmetrics(accept)


@pytest.mark.parametrize(
    ("accept_encoding", "acceptable"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip;q=0.0, deflate", False),
        ("deflate, br", False),
        ("*", True),
        ("*;q=0", False),
        ("gzip;q=0, *", False),  # named beats the wildcard
        ("x-gzip", True),
        ("notgzip, gzipped", False),  # a substring is not a name
        ("", False),
        (None, False),
    ],
)
def test_gzip_only_when_acceptable(accept_encoding: str | None, acceptable: bool) -> None:
    assert gzip_acceptable(accept_encoding) is acceptable
