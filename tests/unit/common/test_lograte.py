"""Rate-limited logging: a flood of one kind of event writes a few lines, and says how many it dropped."""

from __future__ import annotations

import logging

import pytest

from inferwatch.common.lograte import RateLimit
from tests.support.clock import ManualClock


@pytest.fixture
def logger(request: pytest.FixtureRequest) -> logging.Logger:
    log = logging.getLogger(f"inferwatch.test.lograte.{request.node.name}")
    log.setLevel(logging.INFO)
    return log


def test_each_kind_gets_its_burst_per_window(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    logger.addFilter(RateLimit(burst=3, window=60, clock=ManualClock()))
    with caplog.at_level(logging.INFO, logger=logger.name):
        for xid in range(1000):
            logger.warning("GPU %d: XID %d", 0, xid)
        logger.info("another kind of event")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["GPU 0: XID 0", "GPU 0: XID 1", "GPU 0: XID 2", "another kind of event"]


def test_the_next_line_after_a_window_counts_what_was_dropped(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    logger.addFilter(RateLimit(burst=1, window=0.2, clock=clock))
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(50):
            logger.warning("slow client from %s", "127.0.0.1")
        clock.advance(0.25)
        logger.warning("slow client from %s", "127.0.0.1")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "slow client from 127.0.0.1",
        "slow client from 127.0.0.1 (and 49 more like this not logged)",
    ]


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="burst >= 1"):
        RateLimit(burst=0)
    with pytest.raises(ValueError, match="window > 0"):
        RateLimit(window=0)
