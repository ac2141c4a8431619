"""The metrics endpoint's answers, encoded: the format chosen by the ``q`` values of ``Accept``
(prometheus_client's encoders, their versions and escapings), gzip when ``Accept-Encoding`` accepts it,
and ``name[]`` in the query string restricting the answer to the samples of those names; 406 when
``Accept`` refuses every format (``*/*;q=0``).

:mod:`.server`'s apps and endpoint answer with these; one collection of a registry can be encoded in
every variant a request asks for (:class:`Collected`).
"""

from __future__ import annotations

import copy
import gzip
from collections.abc import Iterable
from http import HTTPStatus
from typing import NamedTuple
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from inferwatch.common.negotiation import (
    OPENMETRICS,
    TEXT,
    NotAcceptable,
    choose_media_type,
    gzip_acceptable,
)
from inferwatch.common.prerendered import PrerenderedFamily, encode_families

# Level 1: a fifth of the size for a fraction of the CPU of gzip's default level 9.
_GZIP_LEVEL = 1


class Encoded(NamedTuple):
    """A rendered answer: body and headers (Content-Type, and Content-Encoding when compressed)."""

    body: bytes
    headers: tuple[tuple[str, str], ...]


class Variant(NamedTuple):
    """What the answer to a request depends on: requests that ask for the same variant get the same bytes."""

    media: str  # the ``Accept`` entry that chose the format, for prometheus_client's choose_encoder
    gzip: bool
    names: frozenset[str] | None  # ``name[]`` of the query string; None: every metric


def variant_of(accept: str | None, accept_encoding: str | None, query: str) -> Variant:
    """What a request with these ``Accept`` and ``Accept-Encoding`` headers and query string asks for;
    raises :class:`~inferwatch.common.negotiation.NotAcceptable` when ``Accept`` refuses every format."""
    _, media = choose_media_type(accept, (TEXT, OPENMETRICS))
    names = parse_qs(query).get("name[]")
    return Variant(media, gzip_acceptable(accept_encoding), frozenset(names) if names else None)


class Collected:
    """Metric families collected once, as a collector: prometheus_client's encoders take anything with
    ``collect()``, so one collection can be encoded in every format."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def restricted(families: Iterable[Metric], names: frozenset[str]) -> list[Metric]:
    """The families with only their samples named in ``names``, those left with none dropped: what
    prometheus_client's restricted registry serves (``name[]``), for any collector, with units kept."""
    out: list[Metric] = []
    for family in families:
        if isinstance(family, PrerenderedFamily):
            lines = family.restricted(names)
            if lines is not None:
                out.append(lines)
            continue
        samples = [sample for sample in family.samples if sample.name in names]
        if samples:
            kept = copy.copy(family)
            kept.samples = samples
            out.append(kept)
    return out


def encode(collected: Collector, variant: Variant) -> Encoded:
    encoder, content_type = choose_encoder(variant.media)
    body = encode_families(encoder, collected.collect())
    headers = [("Content-Type", content_type)]
    if variant.gzip:
        body = gzip.compress(body, compresslevel=_GZIP_LEVEL)
        headers.append(("Content-Encoding", "gzip"))
    return Encoded(body, tuple(headers))


def render(registry: Collector, accept: str | None, accept_encoding: str | None, query: str = "") -> Encoded:
    """The exposition of ``registry``, collected now, as the request headers ask for it; ``name[]`` in
    the query string restricts it to the samples of those names, as with prometheus_client. Raises
    :class:`~inferwatch.common.negotiation.NotAcceptable` (before collecting) when ``Accept`` refuses
    every format."""
    variant = variant_of(accept, accept_encoding, query)
    if variant.names is not None:
        registry = Collected(restricted(registry.collect(), variant.names))
    return encode(registry, variant)


def answer(
    registry: Collector, method: str, accept: str | None, accept_encoding: str | None, query: str = ""
) -> tuple[HTTPStatus, Encoded]:
    """The status and answer of a mounted app (WSGI or ASGI) to a request: :func:`render`'s for GET and
    HEAD, 406 when ``Accept`` refuses every format, 405 for other methods."""
    if method not in ("GET", "HEAD"):
        return HTTPStatus.METHOD_NOT_ALLOWED, method_not_allowed()
    try:
        return HTTPStatus.OK, render(registry, accept, accept_encoding, query)
    except NotAcceptable as refused:
        return HTTPStatus.NOT_ACCEPTABLE, not_acceptable(refused)


def method_not_allowed() -> Encoded:
    return Encoded(b"Method not allowed\n", (("Content-Type", "text/plain"), ("Allow", "GET, HEAD")))


def not_acceptable(refused: NotAcceptable) -> Encoded:
    return Encoded(f"{refused}\n".encode(), (("Content-Type", "text/plain"),))
