"""Metric families whose sample lines are already encoded: an exposition made of them costs a join of
bytes per family, not a formatting of every sample.

A :class:`PrerenderedFamily` is a prometheus_client ``Metric`` (name, help, type, unit) that carries its
sample lines as bytes, ``name{labels} value`` each: the lines prometheus_client's text format (0.0.4 and
1.0.0) and OpenMetrics (1.0.0 and 2.0.0) write alike for a family with legacy names, no exemplars, no
timestamps and no native histograms, under the ``underscores`` and ``allow-utf-8`` escapings.
:func:`encode_families` writes an exposition of such families and ordinary ones with one of
prometheus_client's encoders, byte for byte what that encoder writes of the same samples: each
prerendered family's ``# HELP``/``# TYPE``/``# UNIT`` lines are the encoder's own (of the family without
samples), its lines follow. Where the encoder would write the lines otherwise (the ``dots`` and
``values`` escapings rewrite names), and for any other reader of ``samples``, the samples are there too:
made when first read, from the values the lines were made of, or parsed back from the lines.

Hand-written for a measured reason (docs/benchmarks.md, "Issue 41: the endpoint at 64 models"): at 64
instrumented models, prometheus_client's collection and encoding of every sample at every scrape took the
serving process past the endpoint's rendering budget and the scrapes past 100 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_EOF = b"# EOF\n"
# The escapings (prometheus_client 0.22 on) under which the encoders write a legacy name's sample as
# ``name{labels} value``; ``dots`` and ``values`` rewrite the names (the OpenMetrics encoder even a legal
# one's, under ``values``), so a family is encoded from its samples there. Before 0.22 an encoder has no
# escaping, and writes the plain form.
_PLAIN_ESCAPINGS = (None, "underscores", "allow-utf-8")
# Headers as an encoder writes them, by (encoder's identity, name, help, type, unit): a few dozen.
_HEADERS_KEPT = 1024
_headers: dict[tuple[Any, ...], bytes] = {}


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


class PrerenderedFamily(Metric):
    """A family with its sample lines encoded (``lines``); ``samples`` made when first read, by
    ``make_samples`` where given, else parsed from ``lines``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        unit: str,
        lines: bytes,
        make_samples: Callable[[], list[Sample]] | None = None,
    ) -> None:
        super().__init__(name, documentation, typ, unit)
        self.lines = lines
        self._make_samples = make_samples
        self._samples: list[Sample] | None = None

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = self._make_samples() if self._make_samples is not None else self._parsed()
        return self._samples

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        self._samples = samples

    def _parsed(self) -> list[Sample]:
        sample_name = f"{self.name}_total" if self.type == "counter" else self.name
        text = f"# TYPE {sample_name} {self.type}\n".encode() + self.lines
        parsed = list(text_string_to_metric_families(text.decode()))
        return [sample for family in parsed for sample in family.samples]

    def header(self) -> Metric:
        """The family without samples (what an encoder writes its header lines from)."""
        return Metric(self.name, self.documentation, self.type, self.unit)

    def restricted(self, names: frozenset[str]) -> PrerenderedFamily | None:
        """The family with only the lines of samples named in ``names``; None when none is left."""
        kept = [line for line in self.lines.splitlines(keepends=True) if _sample_name(line) in names]
        if not kept:
            return None
        return PrerenderedFamily(self.name, self.documentation, self.type, self.unit, b"".join(kept))


def _sample_name(line: bytes) -> str:
    end = len(line)
    for stop in (b"{", b" "):
        found = line.find(stop)
        if 0 <= found < end:
            end = found
    return line[:end].decode()


def _escaping(encoder: Callable[..., bytes]) -> str | None:
    keywords = getattr(encoder, "keywords", None) or {}
    return keywords.get("escaping")


def _header(encoder: Callable[..., bytes], family: PrerenderedFamily) -> bytes:
    func = getattr(encoder, "func", encoder)
    keywords = tuple(sorted((getattr(encoder, "keywords", None) or {}).items()))
    key = (func, keywords, family.name, family.documentation, family.type, family.unit)
    header = _headers.get(key)
    if header is None:
        header = _without_eof(encoder(_Families([family.header()])))
        if len(_headers) >= _HEADERS_KEPT:
            _headers.clear()
        _headers[key] = header
    return header


def encode_families(encoder: Callable[..., bytes], families: Iterable[Metric]) -> bytes:
    """``encoder`` (one of prometheus_client's: ``generate_latest`` of either format, with its escaping
    and version) of ``families``: what it writes of them, with each :class:`PrerenderedFamily`'s lines
    joined in rather than formatted sample by sample."""
    families = list(families)
    if _escaping(encoder) not in _PLAIN_ESCAPINGS or not any(
        isinstance(f, PrerenderedFamily) for f in families
    ):
        return encoder(_Families(families))
    openmetrics = _is_openmetrics(encoder)
    parts: list[bytes] = []
    plain: list[Metric] = []
    for family in families:
        if isinstance(family, PrerenderedFamily):
            if plain:
                parts.append(_without_eof(encoder(_Families(plain))))
                plain = []
            parts.append(_header(encoder, family))
            parts.append(family.lines)
        else:
            plain.append(family)
    if plain:
        parts.append(_without_eof(encoder(_Families(plain))))
    if openmetrics:
        parts.append(_EOF)
    return b"".join(parts)


def _without_eof(body: bytes) -> bytes:
    return body[: -len(_EOF)] if body.endswith(_EOF) else body


_openmetrics_encoders: dict[Any, bool] = {}


def _is_openmetrics(encoder: Callable[..., bytes]) -> bool:
    """Whether ``encoder`` ends its expositions with ``# EOF`` (OpenMetrics)."""
    func = getattr(encoder, "func", encoder)
    known = _openmetrics_encoders.get(func)
    if known is None:
        known = _openmetrics_encoders[func] = encoder(_Families([])).endswith(_EOF)
    return known
