"""The instrumentation endpoint at 64 models in one process (issue 41): what a collection and its encodings
cost, prometheus_client's own path against inferwatch's, and what a Prometheus-like client gets.

``paths`` (one process, the paths side by side, interleaved round by round on the same models): 64
tiny-llamas instrumented on a registry with the issue-41 layout and 64 on a registry with the layout
before it (the ITL's 22 buckets for TPOT and the worst stall, the token buckets for ``llm_step_tokens``);
every round one model of each generates, then, per path, the CPU seconds (``time.thread_time``) of
collecting in the serving process, packing the collection for the helper, unpacking it there, encoding
the text format and OpenMetrics, and gzip (level 1) of the OpenMetrics body. Paths:

* ``before``: the old layout, prometheus_client's own collection of every family (``_created`` on), the
  samples pickled, prometheus_client's encoders: the endpoint before issue 41;
* ``prometheus_client``: the issue-41 layout, still prometheus_client's collection and encoders
  (``_created`` off): what dropping series alone buys;
* ``inferwatch``: the issue-41 layout through the catalogue's collector and the prerendered families
  (instrumentation/metrics/collector.py, common/prerendered.py): the hand-written path.

``e2e``: the timing test's set-up (tests/integration/serving/test_endpoint_models.py) for ``--seconds``:
``start_http_server``, one model generating every 0.1 s, a scraper in another process once a second;
the answers' age and latency. ``--inferwatch-path DIR`` imports inferwatch from ``DIR`` (a folder with an
``inferwatch`` package, e.g. symlinks into a checkout of an older commit), to run the same against it.

    python tests/benchmarks/endpoint_models.py paths --rounds 30 --json paths.json
    python tests/benchmarks/endpoint_models.py e2e --seconds 30 [--inferwatch-path DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

MODELS = 64
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
TEXT = "text/plain; version=0.0.4"


class _PrometheusClientPath:
    """prometheus_client's own collection of the catalogue's families: each family's ``collect()``, what
    registering them one by one served (the oldest-age refresh first, as the endpoint did)."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics

    def collect(self) -> list[Any]:
        from inferwatch.instrumentation.metrics.catalogue import CATALOGUE

        self._metrics._refresh_running_ages()
        return [family for spec in CATALOGUE for family in self._metrics[spec].collect()]


def _series(text: bytes) -> int:
    return sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))


def _measure(collect: Callable[[], list[Any]], lines: bool) -> dict[str, float]:
    from prometheus_client.exposition import choose_encoder

    from inferwatch.common.frames import pack_families, unpack_families
    from inferwatch.common.prerendered import encode_families

    cpu: dict[str, float] = {}
    started = time.thread_time()
    families = collect()
    cpu["collect"] = time.thread_time() - started
    started = time.thread_time()
    body = pack_families(families, lines=lines)
    cpu["pack"] = time.thread_time() - started
    started = time.thread_time()
    shipped = unpack_families(body, trusted=lines)
    cpu["unpack"] = time.thread_time() - started
    for name, accept in (("text", TEXT), ("openmetrics", OPENMETRICS)):
        encoder, _ = choose_encoder(accept)
        started = time.thread_time()
        encoded = encode_families(encoder, shipped)
        cpu[name] = time.thread_time() - started
    started = time.thread_time()
    gzip.compress(encoded, compresslevel=1)
    cpu["gzip"] = time.thread_time() - started
    cpu["serving_process"] = cpu["collect"] + cpu["pack"]
    cpu["helper"] = cpu["unpack"] + cpu["openmetrics"] + cpu["gzip"]
    cpu["bytes"] = len(encoded)
    cpu["series"] = _series(encoded)
    return cpu


def run_paths(rounds: int) -> dict[str, Any]:
    import prometheus_client
    from prometheus_client import CollectorRegistry

    from inferwatch.instrumentation import InstrumentConfig
    from inferwatch.instrumentation.config import DEFAULT_ITL_BUCKETS, DEFAULT_TOKEN_BUCKETS
    from inferwatch.instrumentation.metrics.catalogue import existing_metrics
    from tests.support.manymodels import Generating, build_models

    old = InstrumentConfig(tpot_buckets=DEFAULT_ITL_BUCKETS, step_token_buckets=DEFAULT_TOKEN_BUCKETS)
    registries = {"new": CollectorRegistry(), "old": CollectorRegistry()}
    configs = {"new": None, "old": old}
    built = {key: build_models(MODELS, registry, config=configs[key]) for key, registry in registries.items()}
    generating = {key: Generating(models) for key, (models, _) in built.items()}
    for each in generating.values():
        each.warm()
    paths: dict[str, tuple[Callable[[], list[Any]], bool, bool]] = {
        # name: (collect, lines, _created)
        "before": (_PrometheusClientPath(existing_metrics(registries["old"])).collect, False, True),
        "prometheus_client": (
            _PrometheusClientPath(existing_metrics(registries["new"])).collect,
            False,
            False,
        ),
        "inferwatch": (lambda: list(registries["new"].collect()), True, False),
    }
    first = {
        name: _measure(collect, lines) for name, (collect, lines, _) in paths.items() if name == "inferwatch"
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    for index in range(rounds):
        for key, each in generating.items():
            each.generate(built[key][0][index % MODELS])
        order = list(paths) if index % 2 == 0 else list(reversed(paths))
        for name in order:
            collect, lines, created = paths[name]
            (
                prometheus_client.enable_created_metrics
                if created
                else prometheus_client.disable_created_metrics
            )()
            results[name].append(_measure(collect, lines))
    prometheus_client.enable_created_metrics()
    for _, handles in built.values():
        for handle in handles:
            handle.remove()
    summary = {
        name: {
            key: {
                "median": statistics.median(r[key] for r in runs),
                "p90": statistics.quantiles([r[key] for r in runs], n=10)[-1],
            }
            for key in runs[0]
        }
        for name, runs in results.items()
    }
    return {
        "rounds": rounds,
        "models": MODELS,
        "first_inferwatch_collection": first["inferwatch"],
        "paths": summary,
    }


def run_e2e(seconds: float) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from inferwatch.instrumentation import start_http_server
    from tests.support.manymodels import (
        measure_ages,
        quantile,
        scrape_from_another_process,
        serving_models,
    )

    registry = CollectorRegistry()
    with (
        serving_models(MODELS, registry) as (generating, ticker),
        start_http_server(0, registry=registry) as server,
    ):
        scraper = scrape_from_another_process(server.port, seconds)
    measure_ages(scraper.scrapes, list(ticker.times))
    scrapes = scraper.scrapes
    latencies = [s.latency for s in scrapes]
    ages = [s.min_age for s in scrapes]
    return {
        "scrapes": len(scrapes),
        "errors": scraper.errors[:5],
        "requests": generating.requests,
        "age_p50_s": quantile(ages, 0.5),
        "age_max_s": max(ages),
        "stated_age_max_s": max(s.stated_age for s in scrapes),
        "latency_p50_ms": quantile(latencies, 0.5) * 1e3,
        "latency_p99_ms": quantile(latencies, 0.99) * 1e3,
        "latency_max_ms": max(latencies) * 1e3,
        "first_latency_ms": latencies[0] * 1e3,
        "bytes": scrapes[-1].size,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("paths", "e2e"))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--inferwatch-path", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.inferwatch_path is not None:
        sys.path.insert(0, str(args.inferwatch_path))
    import inferwatch.instrumentation

    result = run_paths(args.rounds) if args.mode == "paths" else run_e2e(args.seconds)
    result.update(
        mode=args.mode,
        inferwatch=str(Path(inferwatch.instrumentation.__path__[0]).resolve()),
        python=platform.python_version(),
        cpus=__import__("os").cpu_count(),
        load_average=__import__("os").getloadavg(),
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
