"""The demo's live summary: one line per window, computed from its own metrics the way Prometheus would see
them (TTFT p50/p95 over the window, generated tokens per second, KV-cache bytes held now)."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``(upper bound, count)`` pairs sorted by bound:
    linear interpolation inside the bucket that holds the rank. None when there are no observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    index = bisect.bisect_left([count for _, count in buckets], rank)
    upper, count = buckets[index]
    lower, below = buckets[index - 1] if index > 0 else (0.0, 0.0)
    if math.isinf(upper):
        return lower
    if count == below:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)


@dataclass(frozen=True)
class Collection:
    time: float
    ttft_buckets: list[tuple[float, float]]
    generation_tokens: float
    requests: float


class LiveSummary:
    """One line per window, read from the registry the demo's metrics are on."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self._registry = registry
        self._model = model_name
        self._previous = self._snapshot()
        self._started = self._previous.time

    def _samples(self, family_name: str) -> Iterator[Any]:
        for family in self._registry.collect():
            if family.name == family_name:
                yield from (s for s in family.samples if s.labels.get("model") == self._model)

    def _total(self, family_name: str, sample_name: str) -> float:
        return sum(s.value for s in self._samples(family_name) if s.name == sample_name)

    def _snapshot(self) -> Collection:
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in self._samples("llm_time_to_first_token_seconds")
            if s.name.endswith("_bucket")
        )
        return Collection(
            time=time.monotonic(),
            ttft_buckets=buckets,
            generation_tokens=self._total("llm_generation_tokens", "llm_generation_tokens_total"),
            requests=self._total("llm_requests", "llm_requests_total"),
        )

    def line(self) -> str:
        """The summary of the window since the previous call."""
        now, before = self._snapshot(), self._previous
        self._previous = now
        window = [
            (bound, count - dict(before.ttft_buckets).get(bound, 0.0)) for bound, count in now.ttft_buckets
        ]
        p50, p95 = (histogram_quantile(q, window) for q in (0.5, 0.95))
        ttft = "TTFT p50 -, p95 -" if p50 is None else f"TTFT p50 {_ms(p50)}, p95 {_ms(p95)}"
        tokens_per_second = (now.generation_tokens - before.generation_tokens) / max(
            now.time - before.time, 1e-9
        )
        kv_bytes = self._total("llm_kv_cache_bytes", "llm_kv_cache_bytes")
        return (
            f"[{now.time - self._started:6.0f} s] {ttft} | {tokens_per_second:7.1f} tokens/s | "
            f"KV cache {_mib(kv_bytes)} | {now.requests:.0f} requests"
        )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _mib(size: float) -> str:
    return f"{size / 2**20:.2f} MiB"
