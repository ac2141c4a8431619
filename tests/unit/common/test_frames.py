"""Frames and packed collections: data that round-trips what the endpoint serves, read in bounded pieces."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from inferwatch.common.frames import (
    PREFIX,
    FrameReader,
    ProtocolError,
    frame,
    pack_families,
    unpack_families,
)
from inferwatch.common.prerendered import PrerenderedFamily, encode_families
from tests.support.clock import ManualClock


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("app_events", "Events.", ["kind"], registry=registry).labels("a").inc(2, exemplar={"trace": "t1"})
    Histogram("app_seconds", "Times.", buckets=(0.1, 1.0), registry=registry).observe(
        0.5, exemplar={"trace": "t2"}
    )

    class Stamped:
        def collect(self) -> list[GaugeMetricFamily]:
            family = GaugeMetricFamily("app_level", "Level.", unit="bytes")
            family.add_metric([], 4.5, timestamp=1_750_000_000.25)
            return [family]

    registry.register(Stamped())
    return registry


class _Families:
    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> list:
        return self._families


def test_a_trusted_collection_round_trips_exemplars_timestamps_and_lines() -> None:
    families = list(_registry().collect())
    lines = b'app_lines{model="m"} 3.0\n'
    families.append(PrerenderedFamily("app_lines", "Lines.", "gauge", "", lines))
    shipped = unpack_families(pack_families(families, lines=True), trusted=True)
    encoder, _ = choose_encoder("application/openmetrics-text; version=1.0.0")
    assert encode_families(encoder, shipped) == encode_families(encoder, families)
    assert b"# {trace=" in encode_families(encoder, shipped)


def test_an_untrusted_collection_keeps_no_exemplar_and_no_lines() -> None:
    families = list(_registry().collect())
    shipped = unpack_families(pack_families(families))
    body = openmetrics(_Families(shipped))
    assert b"# {" not in body
    assert b"app_level_bytes 4.5 1750000000.25" in body
    for family in families:
        family.samples = [sample._replace(exemplar=None) for sample in family.samples]
    assert body == openmetrics(_Families(families))
    lined = pack_families([PrerenderedFamily("app_lines", "", "gauge", "", b"app_lines 1.0\n")], lines=True)
    with pytest.raises(ProtocolError):
        unpack_families(lined)


def test_a_frame_read_a_byte_at_a_time_is_whole_once_its_last_byte_came() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(64, 64)
        data = frame({"op": "families", "id": 3}, b"body")
        for index, byte in enumerate(data):
            theirs.send(bytes([byte]))
            whole = reader.read(ours)
            assert (whole is None) == (index < len(data) - 1)
        assert whole == ({"op": "families", "id": 3}, b"body")


def test_a_frame_is_bounded_at_its_prefix_and_due_whole_within_its_time() -> None:
    clock = ManualClock()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = FrameReader(64, 100, timeout=5.0, now=clock.monotonic)
        assert not reader.overdue(clock.monotonic())
        theirs.send(frame({"op": "families", "id": 1}, b"x" * 10)[:3])
        assert reader.read(ours) is None  # the frame has begun: its time runs
        clock.advance(4.9)
        assert not reader.overdue(clock.monotonic())
        clock.advance(0.2)
        assert reader.overdue(clock.monotonic())
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.send(PREFIX.pack(2, 101))  # 101 bytes announced, none sent: refused on the prefix
        with pytest.raises(ProtocolError, match="body of 101 bytes"):
            while FrameReader(64, 100).read(ours) is None:
                pass
