"""What a capture's Chrome trace says: the top ops, where the GPU idled, the steps, and a verdict.

It reads the trace torch's profiler wrote (``inferwatch profile`` fetches it from the serving process) as
JSON, in the CLI's process: no torch, and none of the serving process's CPU. At most
:data:`MAX_EVENTS` complete events are read, the earliest.

* **Top ops**: CUDA kernels (and memory copies and sets) by total device time, as the notes' table of
  ``key_averages()`` has them; in a trace without device activity (a model on the CPU), operators by
  self CPU time (their time less that of the operators they called).
* **The GPU's idle time** over the window (from the start of the first captured step to the end of the
  last), split by what the device was waiting for at each gap between its busy intervals:

  - *gaps between kernels*: the next kernel had been launched before the device went idle (launch
    latency, a dependency between streams): the device, not the host, set the pace;
  - *synchronization waits*: the host was inside a synchronizing call (``cudaStreamSynchronize``, a
    blocking copy...) when the device went idle: the host had queued nothing more, because it waited;
  - *host wait*: the rest: the host was busy elsewhere (Python, the tokenizer, the streamer) and
    launched the next kernel late.

* **Steps**: each ``inferwatch.step PHASE N`` range the capture put around a forward step, with its
  wall time and the device time of the kernels it launched; totals per phase.
* **Verdict**, in ``inferwatch diagnose``'s vocabulary: ``host-bound`` or ``launch-bound`` when the
  device idled for more than ``InferwatchHostBound``'s busy-ratio threshold allows (by which of the idle
  kinds dominates: waits on the host, or gaps between launched kernels), else ``bandwidth-bound`` (decode
  steps hold most device time) or ``compute-bound`` (prefill steps do); each with its checklist items.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import checklist
from .checklist import ChecklistItem
from .checks.thresholds import default_thresholds

#: Complete events read from one trace: bounds the CLI's memory and time on a trace of any size.
MAX_EVENTS = 2_000_000
#: Rows of the top-ops table.
TOP = 15
STEP_PREFIX = "inferwatch.step "
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: Runtime calls that block the host until the device (or a stream, an event) has caught up.
SYNCHRONIZING = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "cudaMemcpy",  # blocking copies (cudaMemcpy, cudaMemcpy2D...); cudaMemcpyAsync is excluded below
    "cuStreamSynchronize",
    "cuCtxSynchronize",
)

VERDICT_ITEMS: dict[str, tuple[ChecklistItem, ...]] = {
    "host-bound": (checklist.OVERLAP, checklist.COMPILE, checklist.BATCHING),
    "launch-bound": (checklist.COMPILE, checklist.CUDA_GRAPHS, checklist.BATCHING),
    "bandwidth-bound": (checklist.INT4, checklist.BATCHING, checklist.SPECULATIVE),
    "compute-bound": (checklist.BF16, checklist.SDPA),
}


@dataclass(frozen=True)
class Interval:
    start: float  # µs, the trace's clock
    end: float


@dataclass
class Op:
    name: str
    calls: int = 0
    total_us: float = 0.0

    def to_dict(self, whole_us: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "total_seconds": self.total_us / 1e6,
            "mean_seconds": self.total_us / 1e6 / self.calls if self.calls else 0.0,
            "share": self.total_us / whole_us if whole_us else 0.0,
        }


@dataclass
class Step:
    index: int
    phase: str
    start: float
    end: float
    thread: Any
    device_us: float = 0.0

    def to_dict(self, device: bool) -> dict[str, Any]:
        return {
            "index": self.index,
            "phase": self.phase,
            "wall_seconds": (self.end - self.start) / 1e6,
            "device_seconds": self.device_us / 1e6 if device else None,
        }


@dataclass
class Summary:
    """A trace's summary; :meth:`to_dict` is ``inferwatch profile --json``'s document."""

    events: int
    truncated: bool
    window_us: float
    device: bool
    top_by: str
    top: list[Op]
    top_whole_us: float
    steps: list[Step]
    busy_us: float | None = None
    idle: dict[str, float] = field(default_factory=dict)  # kind -> µs
    verdict: str | None = None
    why: str = ""

    def phase_totals(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for phase in ("prefill", "decode"):
            steps = [s for s in self.steps if s.phase == phase]
            walls = [(s.end - s.start) / 1e6 for s in steps]
            out[phase] = {
                "steps": len(steps),
                "wall_seconds": sum(walls),
                "median_step_seconds": statistics.median(walls) if walls else None,
                "device_seconds": sum(s.device_us for s in steps) / 1e6 if self.device else None,
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        idle_total = sum(self.idle.values())
        return {
            "events": self.events,
            "events_truncated": self.truncated,
            "window_seconds": self.window_us / 1e6,
            "device_activity": self.device,
            "top_by": self.top_by,
            "top": [op.to_dict(self.top_whole_us) for op in self.top],
            "device_busy_seconds": None if self.busy_us is None else self.busy_us / 1e6,
            "device_busy_ratio": None
            if self.busy_us is None or not self.window_us
            else self.busy_us / self.window_us,
            "idle": None
            if self.busy_us is None
            else {
                "seconds": idle_total / 1e6,
                **{f"{kind}_seconds": us / 1e6 for kind, us in self.idle.items()},
            },
            "phases": self.phase_totals(),
            "steps": [s.to_dict(self.device) for s in self.steps],
            "verdict": self.verdict,
            "verdict_reason": self.why,
            "checklist": [item.to_dict() for item in VERDICT_ITEMS.get(self.verdict or "", ())],
        }


def load_trace(path: Path) -> dict[str, Any]:
    """A trace file, compressed (``.json.gz``) or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def summarize(trace: dict[str, Any]) -> Summary:
    """The summary of a Chrome trace of torch's profiler (``traceEvents``)."""
    complete = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and "dur" in e]
    truncated = len(complete) > MAX_EVENTS
    complete = sorted(complete, key=lambda e: float(e["ts"]))[:MAX_EVENTS]
    steps = _steps(complete)
    if steps:
        window = Interval(min(s.start for s in steps), max(s.end for s in steps))
    elif complete:
        window = Interval(float(complete[0]["ts"]), max(_end(e) for e in complete))
    else:
        window = Interval(0.0, 0.0)
    kernels = [e for e in complete if e.get("cat") in DEVICE_CATEGORIES and _inside(e, window)]
    if kernels:
        top, whole = _top(kernels), sum(float(e["dur"]) for e in kernels)
        top_by = "device time"
    else:
        ops = [e for e in complete if e.get("cat") == "cpu_op" and _inside(e, window)]
        top, whole = _top_self(ops), sum(op.total_us for op in _top_self(ops, limit=None))
        top_by = "self CPU time"
    summary = Summary(
        len(complete), truncated, window.end - window.start, bool(kernels), top_by, top, whole, steps
    )
    if kernels:
        runtime = [e for e in complete if e.get("cat") in RUNTIME_CATEGORIES]
        _attribute(steps, kernels, runtime)
        summary.busy_us, summary.idle = _idle(window, kernels, runtime)
    summary.verdict, summary.why = _verdict(summary)
    return summary


def _end(event: dict[str, Any]) -> float:
    return float(event["ts"]) + float(event["dur"])


def _inside(event: dict[str, Any], window: Interval) -> bool:
    return float(event["ts"]) < window.end and _end(event) > window.start


def _steps(events: Iterable[dict[str, Any]]) -> list[Step]:
    steps = []
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "user_annotation" or not name.startswith(STEP_PREFIX):
            continue
        phase, _, index = name.removeprefix(STEP_PREFIX).partition(" ")
        start = float(event["ts"])
        steps.append(Step(int(index or 0), phase, start, start + float(event["dur"]), event.get("tid")))
    return sorted(steps, key=lambda s: s.index)


def _top(events: Iterable[dict[str, Any]], limit: int | None = TOP) -> list[Op]:
    ops: dict[str, Op] = {}
    for event in events:
        op = ops.setdefault(str(event.get("name")), Op(str(event.get("name"))))
        op.calls += 1
        op.total_us += float(event["dur"])
    return sorted(ops.values(), key=lambda op: -op.total_us)[:limit]


def _top_self(events: list[dict[str, Any]], limit: int | None = TOP) -> list[Op]:
    """Operators by self time: each one's duration less that of the operators nested in it (same thread)."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_thread[event.get("tid")].append(event)
    ops: dict[str, Op] = {}

    def add(name: str, self_us: float) -> None:
        op = ops.setdefault(name, Op(name))
        op.calls += 1
        op.total_us += max(0.0, self_us)

    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[tuple[float, list[float], str]] = []  # (end, [self µs], name)
        for event in thread_events:
            start, dur = float(event["ts"]), float(event["dur"])
            while stack and stack[-1][0] <= start:
                _, remaining, name = stack.pop()
                add(name, remaining[0])
            if stack:
                stack[-1][1][0] -= dur
            stack.append((start + dur, [dur], str(event.get("name"))))
        for _, remaining, name in stack:
            add(name, remaining[0])
    return sorted(ops.values(), key=lambda op: -op.total_us)[:limit]


def _correlation(event: dict[str, Any]) -> Any:
    return (event.get("args") or {}).get("correlation")


def _attribute(steps: list[Step], kernels: list[dict[str, Any]], runtime: list[dict[str, Any]]) -> None:
    """Each step's device time: the kernels launched (by their runtime call) while the step ran."""
    if not steps:
        return
    launched = {_correlation(e): float(e["ts"]) for e in runtime if _correlation(e) is not None}
    starts = [s.start for s in steps]
    for kernel in kernels:
        at = launched.get(_correlation(kernel))
        if at is None:
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at < steps[i].end:
            steps[i].device_us += float(kernel["dur"])


def _is_sync(event: dict[str, Any]) -> bool:
    name = str(event.get("name", ""))
    return name.startswith(SYNCHRONIZING) and "Async" not in name


def _idle(
    window: Interval, kernels: list[dict[str, Any]], runtime: list[dict[str, Any]]
) -> tuple[float, dict[str, float]]:
    """Busy µs of the device over the window, and its idle µs by kind."""
    launched = {_correlation(e): _end(e) for e in runtime if _correlation(e) is not None}
    syncs = sorted((float(e["ts"]), _end(e)) for e in runtime if _is_sync(e))
    sync_starts = [s for s, _ in syncs]
    ordered = sorted(kernels, key=lambda e: float(e["ts"]))
    idle = {"host_wait": 0.0, "kernel_gaps": 0.0, "sync_wait": 0.0}
    busy = 0.0
    cursor = window.start  # the end of the device's busy time so far
    for kernel in ordered:
        start, end = max(float(kernel["ts"]), window.start), min(_end(kernel), window.end)
        if end <= cursor:
            continue
        if start > cursor:
            idle[_gap_kind(cursor, launched.get(_correlation(kernel)), syncs, sync_starts)] += start - cursor
            cursor = start
        busy += end - cursor
        cursor = end
    if window.end > cursor:
        idle[_gap_kind(cursor, None, syncs, sync_starts)] += window.end - cursor
    return busy, idle


def _gap_kind(
    idle_from: float, launch_end: float | None, syncs: list[tuple[float, float]], sync_starts: list[float]
) -> str:
    if launch_end is not None and launch_end <= idle_from:
        return "kernel_gaps"
    i = bisect.bisect_right(sync_starts, idle_from) - 1
    # The latest sync begun by then: the host was inside it when the device went idle.
    while i >= 0:
        start, end = syncs[i]
        if end >= idle_from:
            return "sync_wait"
        if idle_from - start > 1e6:  # syncs are short; one begun a second earlier cannot hold the gap
            break
        i -= 1
    return "host_wait"


def _verdict(summary: Summary) -> tuple[str | None, str]:
    if summary.busy_us is None:
        return None, "no device activity in the trace (a model on the CPU): no device timeline to judge"
    if not summary.window_us:
        return None, "an empty window"
    busy = summary.busy_us / summary.window_us
    threshold = default_thresholds().busy_ratio_below
    if busy < threshold:
        host = summary.idle["host_wait"] + summary.idle["sync_wait"]
        if summary.idle["kernel_gaps"] > host:
            return "launch-bound", (
                f"the device was busy {busy:.0%} of the window (under {threshold:.0%}), and most of its idle "
                "time was gaps between kernels already launched"
            )
        return "host-bound", (
            f"the device was busy {busy:.0%} of the window (under {threshold:.0%}), and most of its idle "
            "time it waited for the host to launch work"
        )
    phases = summary.phase_totals()
    if (phases["prefill"]["device_seconds"] or 0) > (phases["decode"]["device_seconds"] or 0):
        return "compute-bound", f"the device was busy {busy:.0%} of the window, mostly with prefill steps"
    return "bandwidth-bound", f"the device was busy {busy:.0%} of the window, mostly with decode steps"


def render_text(summary: Summary, heading: str) -> str:
    """The summary as the CLI prints it."""
    doc = summary.to_dict()
    lines = [heading, ""]
    lines.append(
        f"window {doc['window_seconds'] * 1e3:.1f} ms, {len(summary.steps)} steps, {doc['events']} events"
    )
    lines.append("")
    lines.append(f"top ops by {summary.top_by}")
    lines.append(f"  {'name':<60} {'calls':>7} {'total ms':>10} {'mean µs':>9} {'share':>6}")
    for op in doc["top"]:
        name = op["name"] if len(op["name"]) <= 60 else op["name"][:57] + "..."
        lines.append(
            f"  {name:<60} {op['calls']:>7} {op['total_seconds'] * 1e3:>10.2f} "
            f"{op['mean_seconds'] * 1e6:>9.1f} {op['share']:>6.1%}"
        )
    lines.append("")
    if doc["idle"] is not None:
        idle = doc["idle"]
        window = doc["window_seconds"] or 1.0
        lines.append(
            f"device busy {doc['device_busy_ratio']:.1%} of the window; idle {idle['seconds'] * 1e3:.1f} ms: "
            f"host wait {idle['host_wait_seconds'] / window:.1%}, gaps between kernels "
            f"{idle['kernel_gaps_seconds'] / window:.1%}, "
            f"synchronization waits {idle['sync_wait_seconds'] / window:.1%} (shares of the window)"
        )
    else:
        lines.append("device idle time: not applicable (no device activity in the trace)")
    lines.append("")
    for phase, totals in doc["phases"].items():
        if not totals["steps"]:
            continue
        device = totals["device_seconds"]
        lines.append(
            f"{phase}: {totals['steps']} steps, {totals['wall_seconds'] * 1e3:.1f} ms wall, median step "
            f"{totals['median_step_seconds'] * 1e3:.2f} ms"
            + ("" if device is None else f", {device * 1e3:.1f} ms on the device")
        )
    lines.append("")
    if summary.verdict is None:
        lines.append(f"verdict: none ({summary.why})")
    else:
        lines.append(f"verdict: {summary.verdict}: {summary.why}")
        lines.append("checklist:")
        for item in VERDICT_ITEMS[summary.verdict]:
            lines.append(f"  - {item.action}: {item.rationale}")
            lines.append(f"    ({item.source})")
    return "\n".join(lines)
