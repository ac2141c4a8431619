"""The reset guard: exported counters never go down, and keep counting after the raw value resets."""

from __future__ import annotations

from inferwatch.exporter.counters import MonotonicCounters


def test_a_raw_reset_becomes_an_offset() -> None:
    counters = MonotonicCounters()
    exported = [counters.adjust("energy", raw) for raw in (10, 25, 3, 8, 2, 40)]
    # 25 then a reset (3): +25; 8 then a reset (2): +8.
    assert exported == [10, 25, 28, 33, 35, 73]
    assert exported == sorted(exported)


def test_keys_are_independent() -> None:
    counters = MonotonicCounters()
    counters.adjust(("a", ("0",)), 5)
    assert counters.adjust(("a", ("1",)), 1) == 1
    assert counters.adjust(("a", ("0",)), 6) == 6
