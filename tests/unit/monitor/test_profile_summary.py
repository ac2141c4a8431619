"""The trace summary of ``inferwatch profile`` on hand-made Chrome traces whose answers are known: the idle
split by kind, per-step device time, self CPU time, and the verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferwatch.monitor.checks.findings import Finding, Severity
from inferwatch.monitor.profile import Profiled, profile_findings, with_oom_evidence
from inferwatch.monitor.profile_summary import VERDICT_ITEMS, summarize


def step(index: int, phase: str, ts: float, dur: float) -> dict[str, Any]:
    name = f"inferwatch.step {phase} {index}"
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": 1}


def launch(correlation: int, ts: float, dur: float = 2.0, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {
        "ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": 1,
        "args": {"correlation": correlation},
    }  # fmt: skip


def kernel(correlation: int, ts: float, dur: float, name: str = "gemm") -> dict[str, Any]:
    return {
        "ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7,
        "args": {"correlation": correlation},
    }  # fmt: skip


def trace(*events: dict[str, Any]) -> dict[str, Any]:
    return {"traceEvents": [{"ph": "M", "name": "process_name"}, *events]}


def test_a_host_bound_window_is_mostly_host_wait() -> None:
    # One 1000 µs decode step; three 10 µs kernels, each launched after the device went idle.
    events = [step(0, "decode", 0, 1000)]
    for i, at in enumerate((100, 400, 700)):
        events += [launch(i, at), kernel(i, at + 5, 10)]
    summary = summarize(trace(*events)).to_dict()
    assert summary["device_activity"] is True
    assert summary["device_busy_seconds"] == pytest.approx(30e-6)
    idle = summary["idle"]
    assert idle["host_wait_seconds"] == pytest.approx(970e-6)
    assert idle["kernel_gaps_seconds"] == 0 and idle["sync_wait_seconds"] == 0
    assert summary["verdict"] == "host-bound"
    assert summary["steps"][0]["device_seconds"] == pytest.approx(30e-6)
    assert summary["top"][0] == {
        "name": "gemm", "calls": 3, "total_seconds": pytest.approx(30e-6),
        "mean_seconds": pytest.approx(10e-6), "share": 1.0,
    }  # fmt: skip
    assert [item["action"][:20] for item in summary["checklist"]]


def test_gaps_behind_kernels_already_launched_are_gaps_between_kernels() -> None:
    # All kernels launched up front; each waits 20 µs behind the previous one on the device: launch-bound.
    events = [step(0, "decode", 0, 200)]
    events += [launch(i, 1 + i) for i in range(5)]
    events += [kernel(i, 10 + 30 * i, 10, name="tiny") for i in range(5)]
    summary = summarize(trace(*events)).to_dict()
    assert summary["idle"]["kernel_gaps_seconds"] == pytest.approx(80e-6)
    assert summary["verdict"] == "launch-bound"


def test_idle_while_the_host_synchronizes_is_a_synchronization_wait() -> None:
    events = [step(0, "decode", 0, 400), launch(0, 0), kernel(0, 5, 95)]
    events.append(launch(99, 50, dur=200, name="cudaStreamSynchronize"))  # 50..250: over the idle start
    events += [launch(1, 300), kernel(1, 305, 95)]
    summary = summarize(trace(*events)).to_dict()
    idle = summary["idle"]
    assert idle["sync_wait_seconds"] == pytest.approx(205e-6)  # 100..305
    assert idle["host_wait_seconds"] == pytest.approx(5e-6)  # the first 5 µs of the window


def test_a_busy_device_is_bandwidth_bound_in_decode_and_compute_bound_in_prefill() -> None:
    decode = [step(0, "decode", 0, 100), launch(0, 0), kernel(0, 1, 99)]
    assert summarize(trace(*decode)).verdict == "bandwidth-bound"
    prefill = [step(0, "prefill", 0, 100), launch(0, 0), kernel(0, 1, 99), step(1, "decode", 100, 10)]
    summary = summarize(trace(*prefill))
    assert summary.verdict == "compute-bound"
    assert summary.phase_totals()["prefill"]["device_seconds"] == pytest.approx(99e-6)


def test_a_cpu_trace_ranks_operators_by_self_time_and_has_no_verdict() -> None:
    def op(name: str, ts: float, dur: float) -> dict[str, Any]:
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 1}

    events = [step(0, "decode", 0, 100), op("aten::linear", 0, 50), op("aten::addmm", 5, 40)]
    events += [op("aten::softmax", 60, 20)]
    summary = summarize(trace(*events)).to_dict()
    assert summary["top_by"] == "self CPU time"
    top = {row["name"]: row["total_seconds"] for row in summary["top"]}
    assert top == pytest.approx({"aten::addmm": 40e-6, "aten::softmax": 20e-6, "aten::linear": 10e-6})
    assert summary["verdict"] is None and summary["idle"] is None
    assert summary["phases"]["decode"]["steps"] == 1


def profiled(summary_trace: dict[str, Any], tmp_path: Path) -> Profiled:
    state = {"steps_captured": 1, "id": "abc"}
    return Profiled(state, tmp_path / "t.json.gz", None, summarize(summary_trace), 0.0)


def test_diagnose_gets_the_verdict_as_a_finding_and_the_oom_files_as_evidence(tmp_path: Path) -> None:
    events = [step(0, "decode", 0, 1000)]
    for i, at in enumerate((100, 400, 700)):
        events += [launch(i, at), kernel(i, at + 5, 10)]
    (finding,) = profile_findings(profiled(trace(*events), tmp_path), "http://serving:8797/metrics")
    assert finding.check == "host-bound" and finding.severity == Severity.WARNING
    assert finding.subject == "profile of http://serving:8797"
    assert {e.what for e in finding.evidence} >= {"device busy over the window", "decode steps"}
    assert finding.checklist == VERDICT_ITEMS["host-bound"]
    cpu = [step(0, "decode", 0, 100)]
    assert profile_findings(profiled(trace(*cpu), tmp_path), "http://serving:8797") == []

    oom = {"ooms": 1, "files": [{"summary": "x-oom1-summary.txt", "snapshot": "x-oom1-memory.pickle"}]}
    metrics_oom = Finding("oom-risk", Severity.CRITICAL, "model m", "out-of-memory errors happened", (), ())
    (attached,) = with_oom_evidence([metrics_oom], oom, "http://serving:8797")
    assert "x-oom1-memory.pickle" in attached.evidence[-1].value
    (own,) = with_oom_evidence([], oom, "http://serving:8797")
    assert own.check == "oom-risk" and own.severity == Severity.CRITICAL
    assert with_oom_evidence([metrics_oom], {"ooms": 0, "files": []}, "u") == [metrics_oom]
