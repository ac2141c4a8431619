"""The hub's wire format (issue 48): what carrying a collection costs, the pickle it replaced against the
checked JSON of ``inferwatch.common.frames``.

An engine process's registry with ``--models`` instrumented tiny-llamas (each has generated, so every
series exists) is collected as a peer of ``inferwatch run``'s hub collects it for each endpoint
collection (``program._own_families``); then, per round and per format, the CPU seconds
(``time.thread_time``) of packing it in the peer, of unpacking it in the owner, and the body's bytes:

* ``pickle``: the format before issue 48 (``pickle.dumps`` of each family's name, help, type, unit and
  ``Sample`` tuples; ``pickle.loads``), written out here since the product no longer has it;
* ``json``: ``pack_families`` / ``unpack_families`` as the hub uses them, every field checked.

``--helper`` measures the endpoint's helper's channel instead (the serving process's collection with its
prerendered lines, ``lines=True``), which moved to the same format.

    .venv/bin/python tests/benchmarks/hub_wire.py --models 1 --rounds 50
    .venv/bin/python tests/benchmarks/hub_wire.py --models 64 --rounds 20 [--helper] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))


def _pickled(families: list[Any], lines: bool) -> bytes:
    from inferwatch.common.prerendered import PrerenderedFamily

    packed = [
        (
            f.name,
            f.documentation,
            f.type,
            f.unit,
            f.lines if lines and isinstance(f, PrerenderedFamily) else f.samples,
        )
        for f in families
    ]
    return pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL)


def _unpickled(body: bytes, trusted: bool) -> list[Any]:
    from prometheus_client.metrics_core import Metric

    from inferwatch.common.prerendered import PrerenderedFamily

    families: list[Any] = []
    for name, documentation, kind, unit, samples in pickle.loads(body):
        if isinstance(samples, bytes):
            families.append(PrerenderedFamily(name, documentation, kind, unit, samples))
            continue
        family = Metric(name, documentation, kind, unit)
        family.samples = samples
        families.append(family)
    return families


def run(models: int, rounds: int, helper: bool) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from inferwatch.common.frames import pack_families, unpack_families
    from inferwatch.instrumentation.endpoint.program import _own_families
    from tests.support.manymodels import Generating, build_models

    registry = CollectorRegistry()
    built, handles = build_models(models, registry)
    generating = Generating(built)
    generating.warm()
    formats: dict[str, tuple[Callable[..., bytes], Callable[..., list[Any]]]] = {
        "pickle": (_pickled, _unpickled),
        "json": (pack_families, unpack_families),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in formats}
    samples = 0
    for index in range(rounds):
        generating.generate(built[index % models])
        order = list(formats) if index % 2 == 0 else list(reversed(formats))
        for name in order:
            pack, unpack = formats[name]
            families = list(registry.collect()) if helper else _own_families(registry)
            if not helper:
                for family in families:
                    family.samples  # noqa: B018 -- made once, by whichever format reads them first
            started = time.thread_time()
            body = pack(families, lines=helper)
            packed = time.thread_time()
            shipped = unpack(body, trusted=helper)
            unpacked = time.thread_time()
            samples = sum(len(f.samples) for f in shipped if not helper)
            results[name].append(
                {
                    "pack_ms": (packed - started) * 1e3,
                    "unpack_ms": (unpacked - packed) * 1e3,
                    "bytes": len(body),
                }
            )
    for handle in handles:
        handle.remove()
    summary = {
        name: {
            key: {"median": statistics.median(r[key] for r in runs), "max": max(r[key] for r in runs)}
            for key in runs[0]
        }
        for name, runs in results.items()
    }
    return {
        "models": models,
        "rounds": rounds,
        "channel": "helper" if helper else "hub",
        "samples": samples,
        "python": platform.python_version(),
        "formats": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--helper", action="store_true", help="the endpoint's helper's channel (lines=True)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    results = run(args.models, args.rounds, args.helper)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
