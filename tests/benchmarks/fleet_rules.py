"""Rule evaluation for a fleet: the rules of an earlier revision against the working tree's, on Prometheus and
on vmalert over VictoriaMetrics, against a simulated fleet slice of 10, 50 and 100 nodes (docs/benchmarks.md,
"Issue 41: rules at fleet scale").

A node is what one GPU node shows Prometheus: an ``inferwatch-exporter`` over the NVML stand-in with 8
GPUs, and one instrumented serving process with 2 models that served requests. Both expositions are
captured once from the real programs (the exporter under tests/support/fake_nvml.py, the serving process
built here: two built-in models instrumented and run on the CPU, served by ``start_http_server``), then
replayed by one small HTTP server under a path per node and target (``/node/<i>/exporter``,
``/node/<i>/serving``), each scrape target given its own ``instance``. Counters, histogram buckets,
``_sum`` and ``_count`` advance between scrapes (each scaled by one factor that grows with time, so
buckets stay cumulative and every rate is non-zero); gauges replay as captured.

For each fleet size, one Prometheus scrapes every target and evaluates both rule files; it remote-writes
what it scrapes to one VictoriaMetrics, which one vmalert evaluates the same two rule files against. The
rules before are ``git show REV:src/inferwatch/alerts/rules.yaml`` (``--before REV``; by default the merge
base with main) with their groups renamed ``before-*`` and their recorded names prefixed ``before_`` (names
cost nothing; without that, the two files would record the same series), the rules after are the working
tree's ``src/inferwatch/alerts/rules.yaml``.
Scrapes and evaluations run every ``--interval`` (15 s: the interval the extrapolation is for). After
``--fill`` seconds (5 minutes: the 5m windows are full; the 30m, 1h and 6h windows hold only what the run
had, see docs/benchmarks.md), it reads for ``--measure`` seconds:

* Prometheus' own /metrics: ``prometheus_tsdb_head_series``, the rate of
  ``prometheus_tsdb_head_samples_appended_total`` (scraped and recorded samples), and
  ``prometheus_rule_group_last_duration_seconds`` of every group at every new evaluation (median);
* vmalert's /metrics: ``vmalert_iteration_duration_seconds_sum`` / ``_count`` per group over the
  measurement (the mean iteration);
* Prometheus' /api/v1/rules at the end: each rule's time at its group's last evaluation.

With ``--timeline S`` it also reports both totals per S seconds of the measurement, with the seconds of
data the stores held by then: a long measurement shows how the cost grows as the longer windows fill.

Run from the repository root (needs prometheus, victoria-metrics, vmalert on PATH; ~7 minutes per size)::

    python tests/benchmarks/fleet_rules.py --out docs/benchmark-results/dev-2026-12-05/fleet-rules.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from tests.support import PACKAGE_ROOT, free_port, parse_samples  # noqa: E402
from tests.support.services import require_binary, start_exporter, start_process  # noqa: E402

SERVING_JOB = "llm-serving"
EXPORTER_JOB = "inferwatch-exporter"
GPUS_PER_NODE = 8
MODELS = ("chat-llama", "code-gpt2")
BUILTIN = {"chat-llama": "tiny-llama", "code-gpt2": "tiny-gpt2"}
# Counters and histograms grow by this fraction of their captured value per second (times a factor per
# node), so every rate of a series that was non-zero is non-zero.
GROWTH_PER_SECOND = 1 / 600
ADVANCING = ("counter", "histogram", "summary")


# ------------------------------------------------------------------------------------------------ capture


def capture_serving(out: Path) -> None:
    """In a child process: two built-in models, instrumented, each serving a few requests; the endpoint's
    exposition written to ``out``."""
    import torch

    from inferwatch.instrumentation import instrument, start_http_server
    from inferwatch.instrumentation.demo.models import build_model

    torch.manual_seed(0)
    handles = []
    for name in MODELS:
        model = build_model(BUILTIN[name], device="cpu")
        handle = instrument(model, model_name=name)
        handles.append(handle)
        for request in range(12):
            ids = torch.randint(3, 200, (1 + request % 3, 8 + 4 * (request % 5)))
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4 + 3 * (request % 4))
    for handle in handles:
        handle.flush()
    port = free_port()
    start_http_server(port, "127.0.0.1")
    for _ in range(100):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            break
        except OSError:
            time.sleep(0.1)
    out.write_bytes(body)


def capture(workdir: Path) -> dict[str, str]:
    """The two expositions: ``{"exporter": text, "serving": text}``."""
    serving = workdir / "serving.prom"
    subprocess.run(
        [sys.executable, __file__, "--capture-serving", str(serving)],
        check=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    env = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": GPUS_PER_NODE}),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with start_exporter(env=env, workdir=workdir) as (_, address):
        time.sleep(5)  # a few collections: every GPU's series exist
        exporter = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {"exporter": exporter, "serving": serving.read_text()}


# ------------------------------------------------------------------------------------------------- replay


class Template:
    """One exposition, rendered again with its counters advanced."""

    def __init__(self, text: str) -> None:
        types: dict[str, str] = {}
        self.lines: list[tuple[str, float | None]] = []  # (text before the value, value to advance)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(maxsplit=3)
                types[name] = kind
            if not line or line.startswith("#"):
                self.lines.append((line, None))
                continue
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            family = re.sub(r"(_total|_bucket|_count|_sum)$", "", name)
            advance = types.get(family, types.get(name)) in ADVANCING and not name.endswith("_created")
            self.lines.append((f"{series} ", float(value)) if advance else (line, None))
        self.series = sum(1 for text, _ in self.lines if text and not text.startswith("#"))

    def render(self, factor: float) -> bytes:
        out = []
        for text, value in self.lines:
            out.append(text if value is None else f"{text}{value * factor!r}")
        return ("\n".join(out) + "\n").encode()


@contextmanager
def replay_server(templates: dict[str, Template]) -> Iterator[str]:
    """``host:port`` of a server answering ``/node/<i>/<target>``; POSTs (vmalert's notifications) get 200."""
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            match = re.fullmatch(r"/node/(\d+)/(\w+)", self.path)
            if not match or match[2] not in templates:
                self.send_error(404)
                return
            node = int(match[1])
            elapsed = time.monotonic() - started
            factor = 1 + GROWTH_PER_SECOND * (1 + (node % 10) / 10) * elapsed
            body = templates[match[2]].render(factor)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -------------------------------------------------------------------------------------------------- rules


def before_rules(text: str) -> str:
    """The rules before, renamed so they can run beside the rules after: ``before-`` groups,
    ``before_`` recorded names (and every reference to them)."""
    doc = yaml.safe_load(text)
    recorded = {rule["record"] for group in doc["groups"] for rule in group["rules"] if "record" in rule}
    pattern = re.compile(
        r"(?<![\w:])(" + "|".join(map(re.escape, sorted(recorded, key=len)[::-1])) + r")(?![\w:])"
    )
    for group in doc["groups"]:
        group["name"] = f"before-{group['name']}"
        for rule in group["rules"]:
            rule["expr"] = pattern.sub(r"before_\1", rule["expr"])
            if "record" in rule:
                rule["record"] = f"before_{rule['record']}"
    return yaml.safe_dump(doc, sort_keys=False, width=1_000_000)


def rules_at(revision: str | None) -> tuple[str, str]:
    """The commit of ``revision`` (by default the merge base with main) and its ``alerts/rules.yaml``."""
    base = subprocess.run(
        ["git", "rev-parse", revision] if revision else ["git", "merge-base", "HEAD", "main"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    text = subprocess.run(
        ["git", "show", f"{base}:src/inferwatch/alerts/rules.yaml"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return base, text


# ---------------------------------------------------------------------------------------------- services


def metrics_of(url: str) -> list[Any]:
    return parse_samples(urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode())


def prometheus_yml(nodes: int, replay: str, rules: list[Path], vm: str, interval: str) -> dict[str, Any]:
    def job(name: str, target: str, port: int) -> dict[str, Any]:
        return {
            "job_name": name,
            "static_configs": [
                {
                    "targets": [replay],
                    "labels": {"__metrics_path__": f"/node/{i}/{target}", "instance": f"node-{i:04d}:{port}"},
                }
                for i in range(nodes)
            ],
        }

    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rules],
        "scrape_configs": [job(SERVING_JOB, "serving", 8000), job(EXPORTER_JOB, "exporter", 9400)],
        "remote_write": [{"url": f"http://{vm}/api/v1/write"}],
    }


@contextmanager
def fleet(nodes: int, replay: str, rules: list[Path], interval: str, work: Path) -> Iterator[dict[str, str]]:
    """VictoriaMetrics, Prometheus (scraping ``nodes`` nodes, remote-writing to it), vmalert; their URLs."""
    vm_port, prom_port, vmalert_port = free_port(), free_port(), free_port()
    vm, prom, vmalert = (f"127.0.0.1:{p}" for p in (vm_port, prom_port, vmalert_port))
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_yml(nodes, replay, rules, vm, interval), sort_keys=False))
    with ExitStack() as stack:
        stack.enter_context(
            start_process(
                [
                    require_binary("victoria-metrics"),
                    f"-storageDataPath={work / 'vm'}",
                    f"-httpListenAddr={vm}",
                    "-retentionPeriod=1d",
                ],
                f"http://{vm}/health",
                60,
                log_path=work / "vm.log",
            )
        )
        stack.enter_context(
            start_process(
                [
                    require_binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address={prom}",
                ],
                f"http://{prom}/-/ready",
                60,
                log_path=work / "prometheus.log",
            )
        )
        stack.enter_context(
            start_process(
                [
                    require_binary("vmalert"),
                    *(f"-rule={path}" for path in rules),
                    f"-datasource.url=http://{vm}",
                    f"-remoteWrite.url=http://{vm}",
                    f"-notifier.url=http://{replay}",
                    f"-evaluationInterval={interval}",
                    f"-httpListenAddr={vmalert}",
                ],
                f"http://{vmalert}/-/healthy",
                60,
                log_path=work / "vmalert.log",
            )
        )
        yield {"prometheus": f"http://{prom}", "vm": f"http://{vm}", "vmalert": f"http://{vmalert}"}


def _by_label(samples: list[Any], name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples if s.name == name and label in s.labels}


def _value(samples: list[Any], name: str) -> float:
    return sum(s.value for s in samples if s.name == name)


def measure(
    urls: dict[str, str], fill: float, measure_s: float, interval_s: float, timeline_s: float = 0
) -> dict[str, Any]:
    time.sleep(fill)
    prom, vmalert = urls["prometheus"], urls["vmalert"]
    first_prom, first_vma = metrics_of(prom), metrics_of(vmalert)
    started = time.monotonic()
    durations: dict[str, list[float]] = {}
    seen: dict[str, float] = {}
    # With timeline_s: every Prometheus evaluation with its time, and vmalert's totals every timeline_s.
    evaluations: list[tuple[float, str, float]] = []
    vma_snapshots = [(0.0, first_vma)]
    while time.monotonic() - started < measure_s:
        samples = metrics_of(prom)
        now = time.monotonic() - started
        stamps = _by_label(samples, "prometheus_rule_group_last_evaluation_timestamp_seconds", "rule_group")
        for group, duration in _by_label(
            samples, "prometheus_rule_group_last_duration_seconds", "rule_group"
        ).items():
            if stamps.get(group) and stamps[group] != seen.get(group):
                seen[group] = stamps[group]
                durations.setdefault(group.split(";", 1)[1], []).append(duration)
                evaluations.append((now, group.split(";", 1)[1], duration))
        if timeline_s and now - vma_snapshots[-1][0] >= timeline_s:
            vma_snapshots.append((now, metrics_of(vmalert)))
        time.sleep(interval_s / 3)
    elapsed = time.monotonic() - started
    last_prom, last_vma = metrics_of(prom), metrics_of(vmalert)
    appended = _value(last_prom, "prometheus_tsdb_head_samples_appended_total") - _value(
        first_prom, "prometheus_tsdb_head_samples_appended_total"
    )

    def vma(samples: list[Any], suffix: str) -> dict[str, float]:
        return _by_label(samples, f"vmalert_iteration_duration_seconds{suffix}", "group")

    vmalert_ms = {}
    for group, total in vma(last_vma, "_sum").items():
        count = vma(last_vma, "_count")[group] - vma(first_vma, "_count").get(group, 0)
        if count > 0:
            vmalert_ms[group] = 1000 * (total - vma(first_vma, "_sum").get(group, 0)) / count
    rules = json.loads(urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=10).read())["data"]["groups"]
    errors = sorted({r["name"] for g in rules for r in g["rules"] if r.get("health") == "err"})
    figures: dict[str, Any] = {
        "head_series": _value(last_prom, "prometheus_tsdb_head_series"),
        "head_samples_per_second": appended / elapsed,
        "prometheus_group_ms": {g: 1000 * statistics.median(v) for g, v in sorted(durations.items())},
        "prometheus_evaluations_seen": {g: len(v) for g, v in sorted(durations.items())},
        "vmalert_group_ms": dict(sorted(vmalert_ms.items())),
        "vmalert_recording_errors": _value(last_vma, "vmalert_recording_rules_errors_total"),
        "vmalert_alerting_errors": _value(last_vma, "vmalert_alerting_rules_errors_total"),
        "prometheus_rules_in_error": errors,
        # Each rule's time at its group's last evaluation (one sample: where a group's time goes).
        "prometheus_rule_ms_last": {
            g["name"]: [[r["name"], round(1000 * r["evaluationTime"], 2)] for r in g["rules"]] for g in rules
        },
    }
    if timeline_s:
        figures["timeline"] = timeline(evaluations, vma_snapshots, fill, timeline_s)
    return figures


def timeline(
    evaluations: list[tuple[float, str, float]],
    vma_snapshots: list[tuple[float, list[Any]]],
    fill: float,
    window_s: float,
) -> list[dict[str, Any]]:
    """Per window of ``window_s`` seconds of the measurement: the rules' total evaluation time, before and
    after, on Prometheus (per group the median of its evaluations in the window, added) and on vmalert
    (per group the mean iteration in the window, added), to show how it grows as the windows fill."""

    def vma(samples: list[Any], suffix: str) -> dict[str, float]:
        return _by_label(samples, f"vmalert_iteration_duration_seconds{suffix}", "group")

    rows = []
    for (start, first), (end, last) in itertools.pairwise(vma_snapshots):
        per_group: dict[str, list[float]] = {}
        for at, group, duration in evaluations:
            if start <= at < end:
                per_group.setdefault(group, []).append(duration)
        prometheus_ms = {g: 1000 * statistics.median(v) for g, v in per_group.items()}
        vmalert_ms = {}
        for group, total in vma(last, "_sum").items():
            count = vma(last, "_count")[group] - vma(first, "_count").get(group, 0)
            if count > 0:
                vmalert_ms[group] = 1000 * (total - vma(first, "_sum").get(group, 0)) / count
        rows.append(
            {
                "seconds_of_data": round(fill + end),
                "prometheus_total_ms": totals(prometheus_ms),
                "vmalert_total_ms": totals(vmalert_ms),
            }
        )
    return rows


def totals(groups: dict[str, float]) -> dict[str, float]:
    before = sum(ms for g, ms in groups.items() if g.startswith("before-"))
    after = sum(ms for g, ms in groups.items() if not g.startswith("before-"))
    return {"before": before, "after": after}


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line through the points: (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def extrapolate(result: dict[str, Any], target: int) -> dict[str, Any]:
    """The measured sizes' evaluation times, fitted per engine, rule set and group with a line in the
    number of nodes, projected to ``target`` nodes; against the interval, the number of shards (each
    evaluating the rules over target/shards nodes) that keeps the slowest group within it.

    vmalert runs its groups concurrently and a group's rules in order (Prometheus likewise), so a cycle
    fits when its slowest group fits the interval; the sum of the groups is the work per cycle.

    A size where a group of the engine took the interval or longer is left out of that engine's fit
    (when at least two sizes remain): the engine missed cycles there, and what was measured is a machine
    out of CPU, not what the rules cost."""
    interval_ms = 1000.0 * result["interval_seconds"]
    out: dict[str, Any] = {"target_nodes": target, "interval_ms": interval_ms}
    for engine in ("prometheus", "vmalert"):
        sizes = sorted(result["sizes"], key=lambda size: size["nodes"])
        unsaturated = [s for s in sizes if max(s[f"{engine}_group_ms"].values()) < interval_ms]
        if len(unsaturated) >= 2:
            sizes = unsaturated
        nodes = [float(size["nodes"]) for size in sizes]
        out[f"{engine}_fitted_nodes"] = nodes
        for rules in ("before", "after"):
            measured: dict[str, list[float]] = {}
            for group in sizes[0][f"{engine}_group_ms"]:
                times = [size[f"{engine}_group_ms"].get(group) for size in sizes]
                if group.startswith("before-") == (rules == "before") and None not in times:
                    measured[group.removeprefix("before-")] = times
            fits = {group: _fit(nodes, times) for group, times in measured.items()}

            def cycle(n: float, fits: dict[str, tuple[float, float]] = fits) -> dict[str, float]:
                return {group: a + b * n for group, (a, b) in fits.items()}

            totals_ms = [sum(times[i] for times in measured.values()) for i in range(len(sizes))]
            projected = cycle(target)
            slowest = max(projected, key=projected.__getitem__)
            shards = next(
                (k for k in range(1, target + 1) if max(cycle(target / k).values()) <= interval_ms), None
            )
            out[f"{engine}_{rules}"] = {
                "measured_total_ms": totals_ms,
                "measured_ms_per_node": [ms / n for ms, n in zip(totals_ms, nodes, strict=True)],
                "measured_slowest_group_ms": [
                    max(times[i] for times in measured.values()) for i in range(len(sizes))
                ],
                "ms_per_added_node": sum(b for _, b in fits.values()),
                "projected_total_ms": sum(projected.values()),
                "projected_slowest_group": slowest,
                "projected_slowest_group_ms": projected[slowest],
                "slowest_group_share_of_interval": projected[slowest] / interval_ms,
                "shards_to_fit_interval": shards,
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--interval", type=int, default=15, help="scrape and evaluation interval, seconds")
    parser.add_argument("--fill", type=float, default=300, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=90, help="seconds of measurement")
    parser.add_argument(
        "--timeline",
        type=float,
        default=0,
        help="also report the totals per window of this many seconds of the measurement (0: only overall)",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="the revision whose rules are 'before' (default: the merge base with main)",
    )
    parser.add_argument("--target-nodes", type=int, default=1000, help="nodes to extrapolate to")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--report", type=Path, help="measure nothing: print the extrapolation of this earlier --out file"
    )
    parser.add_argument("--capture-serving", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture_serving:
        capture_serving(args.capture_serving)
        return 0
    if args.report:
        print(json.dumps(extrapolate(json.loads(args.report.read_text()), args.target_nodes), indent=2))
        return 0
    interval = f"{args.interval}s"
    run_started = time.time()
    with tempfile.TemporaryDirectory(prefix="fleet-rules-") as tmp:
        work = Path(tmp)
        captured = capture(work)
        templates = {name: Template(text) for name, text in captured.items()}
        base, before_text = rules_at(args.before)
        before, after = work / "rules-before.yaml", work / "rules-after.yaml"
        before.write_text(before_rules(before_text))
        shutil.copy(PACKAGE_ROOT / "alerts" / "rules.yaml", after)
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
        result: dict[str, Any] = {
            "benchmark": "tests/benchmarks/fleet_rules.py",
            "commit": head,
            "rules_before": f"{base[:7]}:src/inferwatch/alerts/rules.yaml",
            "rules_after": f"{head}:src/inferwatch/alerts/rules.yaml",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "interval_seconds": args.interval,
            "fill_seconds": args.fill,
            "measure_seconds": args.measure,
            "node": {
                "gpus": GPUS_PER_NODE,
                "models": list(MODELS),
                "exporter_series": templates["exporter"].series,
                "serving_series": templates["serving"].series,
            },
            "sizes": [],
        }
        with replay_server(templates) as replay:
            for nodes in args.nodes:
                print(f"{nodes} nodes ...", file=sys.stderr, flush=True)
                size_dir = work / f"n{nodes}"
                size_dir.mkdir()
                with fleet(nodes, replay, [before, after], interval, size_dir) as urls:
                    figures = measure(urls, args.fill, args.measure, args.interval, args.timeline)
                figures["nodes"] = nodes
                figures["prometheus_total_ms"] = totals(figures["prometheus_group_ms"])
                figures["vmalert_total_ms"] = totals(figures["vmalert_group_ms"])
                result["sizes"].append(figures)
                print(json.dumps(figures, indent=1), file=sys.stderr, flush=True)
        result["wall_seconds"] = round(time.time() - run_started)
    if len(result["sizes"]) > 1:
        result["extrapolation"] = extrapolate(result, args.target_nodes)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
