"""How far ``histogram_quantile`` is from the exact quantiles, for a classic bucket layout (issue 49, item 1).

For each layout, requests are drawn from log-normal latencies whose spread (sigma of the log) ranges from
a nearly constant latency (0.01) to a wide one (1.0), with a median log-uniform over where the
distribution's 1st to 99th percentiles stay between 5 ms and 60 s (the range the issue names). Each
draw's p50, p90 and p99 are computed exactly (linear between ranks, as numpy and guidellm do) and as
Prometheus' ``histogram_quantile`` reads them from the cumulative bucket counts (linear inside the bucket
that holds the rank; the ``+Inf`` bucket answers the highest bound). Printed: the worst relative error of
each quantile over the draws, by spread and sample count. No Prometheus is needed: the interpolation is
the documented one (promql's ``bucketQuantile``), so the figures are the layouts' own, before any scrape
or ``rate()``.

    python tests/benchmarks/bucket_layouts.py [--draws 200] [--json layouts.json]
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import write_json

from inferwatch.instrumentation.config import DEFAULT_TTFT_BUCKETS

QUANTILES = (0.5, 0.9, 0.99)
SIGMAS = (0.01, 0.03, 0.1, 0.3, 1.0)
COUNTS = (200, 1000, 5000)


def powers(base: float, low: float, high: float) -> tuple[float, ...]:
    first, last = math.floor(math.log(low, base)), math.ceil(math.log(high, base))
    return tuple(base**k for k in range(first, last + 1))


LAYOUTS = {
    "defaults (TTFT)": DEFAULT_TTFT_BUCKETS,
    "2^(1/4) (native schema 2)": powers(2**0.25, 0.001, 480),
    "2^(1/8) (native schema 3)": powers(2**0.125, 0.001, 480),
    "24 a decade, 3 digits": tuple(float(f"{b:.3g}") for b in powers(10 ** (1 / 24), 0.001, 480)),
}


def histogram_quantile(q: float, bounds: tuple[float, ...], cumulative: list[int]) -> float:
    """Prometheus' interpolation over classic buckets (``cumulative`` has the ``+Inf`` count last)."""
    rank = q * cumulative[-1]
    index = bisect.bisect_left(cumulative, rank)
    if index == len(bounds):
        return bounds[-1]
    low = 0.0 if index == 0 else bounds[index - 1]
    below = 0 if index == 0 else cumulative[index - 1]
    return low + (bounds[index] - low) * (rank - below) / (cumulative[index] - below)


def exact(q: float, ordered: list[float]) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def worst_errors(
    bounds: tuple[float, ...], sigma: float, count: int, draws: int, rng: random.Random
) -> list[float]:
    worst = [0.0 for _ in QUANTILES]
    for _ in range(draws):
        tail = 2.33 * sigma  # the 99th percentile of a standard normal, times sigma
        median = math.exp(rng.uniform(math.log(0.005) + tail, math.log(60.0) - tail))
        ordered = sorted(median * math.exp(rng.gauss(0.0, sigma)) for _ in range(count))
        cumulative = [bisect.bisect_right(ordered, bound) for bound in bounds] + [count]
        for i, q in enumerate(QUANTILES):
            truth = exact(q, ordered)
            worst[i] = max(worst[i], abs(histogram_quantile(q, bounds, cumulative) / truth - 1))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=200, help="distributions per spread and count")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    print("| layout | bounds | requests | " + " | ".join(f"sigma {s}: p50/p90/p99 %" for s in SIGMAS) + " |")
    for name, bounds in LAYOUTS.items():
        for count in COUNTS:
            cells = {sigma: worst_errors(bounds, sigma, count, args.draws, rng) for sigma in SIGMAS}
            rows.append({"layout": name, "bounds": len(bounds), "requests": count, "worst": cells})
            shown = " | ".join("/".join(f"{100 * e:.1f}" for e in cells[s]) for s in SIGMAS)
            print(f"| {name} | {len(bounds)} | {count} | {shown} |")
    write_json(args.json, {"args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
