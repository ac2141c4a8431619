"""The bottleneck matrix and fault list on simulated metric histories (tests/unit/monitor/simulation.py)."""

from __future__ import annotations

import pytest

from inferwatch.monitor import checklist
from inferwatch.monitor.checks import Diagnosis, Severity, kv_cache
from inferwatch.monitor.checks.attribution import model_gpus
from tests.unit.monitor.simulation import run


def findings(diagnosis: Diagnosis, check: str) -> list:
    return [f for f in diagnosis.findings if f.check == check]


def test_a_healthy_process_raises_nothing() -> None:
    diagnosis = run(12, serving=lambda i: {}, gpus=lambda i: {})
    assert diagnosis.findings == []
    assert diagnosis.assessed and not diagnosis.alarming
    assert set(diagnosis.passed) >= {
        "host-bound", "launch-bound", "throttling", "fluctuation", "oom-risk", "leak", "tensor-cores"
    }  # fmt: skip


def test_no_data_is_not_assessed_rather_than_passed() -> None:
    diagnosis = run(3)
    assert diagnosis.findings == [] and diagnosis.passed == []
    assert not diagnosis.assessed
    assert set(diagnosis.not_assessed) == {
        "host-bound", "launch-bound", "queueing", "throttling", "fluctuation", "oom-risk", "kv-cache",
        "leak", "bandwidth/compute-bound", "tensor-cores", "scaling",
    }  # fmt: skip


def test_host_bound() -> None:
    diagnosis = run(5, serving=lambda i: {"busy": 0.2})
    (finding,) = findings(diagnosis, "host-bound")
    assert finding.severity == Severity.WARNING
    assert finding.subject == "model m on node:8797"
    assert finding.evidence[0].value == "20%"
    assert finding.evidence[0].query == "avg by (job, instance, model) (llm_gpu_busy_ratio)"
    assert "reference/002" in finding.checklist[0].source
    assert diagnosis.alarming


def test_host_bound_evidence_includes_the_serving_process_cpu() -> None:
    diagnosis = run(5, serving=lambda i: {"busy": 0.2}, gpus=lambda i: {"process_cpu": 0.98})
    (finding,) = findings(diagnosis, "host-bound")
    cpu = finding.evidence[-1]
    assert cpu.what.endswith("python3 (4242)")
    assert cpu.value == "0.98 cores"
    assert cpu.query == "sum by (instance, pid, comm) (rate(inferwatch_process_cpu_seconds_total[1s]))"


def test_host_bound_evidence_includes_the_gpus_graphics_engine() -> None:
    diagnosis = run(5, serving=lambda i: {"busy": 0.2}, gpus=lambda i: {"graphics_active": 0.21})
    (finding,) = findings(diagnosis, "host-bound")
    (graphics,) = [e for e in finding.evidence if e.what.startswith("graphics engine active")]
    assert graphics.value == "21%"
    assert graphics.query == 'max by (instance, gpu, uuid) (gpu_graphics_active_ratio{gpu_instance=""})'


def test_idle_process_is_not_host_bound() -> None:
    diagnosis = run(5, serving=lambda i: {"busy": 0.0, "running": 0, "tokens": 0, "requests": 0})
    assert findings(diagnosis, "host-bound") == []
    assert "host-bound" in diagnosis.not_assessed


def test_fluctuating_latency() -> None:
    diagnosis = run(10, serving=lambda i: {"itl": 0.004 if i % 2 else 0.04})
    itl = [f for f in findings(diagnosis, "fluctuation") if "inter-token" in f.summary]
    assert len(itl) == 1
    assert itl[0].severity == Severity.WARNING


def test_latency_that_follows_the_workload_is_not_fluctuation() -> None:
    # Big batches every other step make ITL differ too: not the same requests, no finding.
    diagnosis = run(10, serving=lambda i: {"itl": 0.004 if i % 2 else 0.04, "batch": 1 if i % 2 else 8})
    assert [f for f in findings(diagnosis, "fluctuation") if "inter-token" in f.summary] == []


def test_throttling_by_hardware_is_critical_and_idle_is_not_throttling() -> None:
    diagnosis = run(5, gpus=lambda i: {"reasons": ("hw_slowdown", "gpu_idle")})
    (finding,) = findings(diagnosis, "throttling")
    assert finding.severity == Severity.CRITICAL
    assert finding.subject == "GPU 0 on node:8798"
    assert "hw_slowdown" in finding.summary and "gpu_idle" not in finding.summary
    assert any(e.what.startswith("SM clock") and e.value == "70%" for e in finding.evidence)
    assert "it serves" not in finding.summary  # no serving process scraped: no user known


def test_throttling_names_the_model_on_the_gpu() -> None:
    diagnosis = run(5, serving=lambda i: {}, gpus=lambda i: {"reasons": ("hw_slowdown",)})
    (finding,) = findings(diagnosis, "throttling")
    assert finding.summary.endswith("; it serves model m on node:8797")


def test_throttle_time_without_a_current_reason() -> None:
    # A power cap that came and went between polls: only the violation counter saw it (30 % of the time,
    # above the 25 % of InferwatchGpuThrottleDutyCycleHigh).
    diagnosis = run(5, gpus=lambda i: {"throttle_duty": 0.3})
    (finding,) = findings(diagnosis, "throttling")
    assert finding.severity == Severity.WARNING
    active, held_back = finding.evidence[:2]
    assert (active.what, active.value) == ("sw_power_cap active (share of the steps)", "0.0%")
    assert (held_back.what, held_back.value) == ("time held back by sw_power_cap (violation counter)", "30%")
    assert (
        held_back.query == "sum by (instance, gpu, uuid, reason) (rate(gpu_clocks_event_seconds_total[1s]))"
    )


def test_throttle_time_follows_the_duty_cycle_alert() -> None:
    # 20 % of the time is under the alert's 25 %: the diagnosis does not contradict the quiet alert.
    assert findings(run(5, gpus=lambda i: {"throttle_duty": 0.2}), "throttling") == []
    duty = {"InferwatchGpuThrottleDutyCycleHigh": {"duty_cycle_ratio_above": 0.1}}
    assert (
        len(findings(run(5, gpus=lambda i: {"throttle_duty": 0.2}, alerts={"alerts": duty}), "throttling"))
        == 1
    )
    # A reason the user took out of the duty-cycle alert's list is not judged by its counter.
    duty = {"InferwatchGpuThrottleDutyCycleHigh": {"reasons": ["hw_thermal_slowdown"]}}
    assert (
        findings(run(5, gpus=lambda i: {"throttle_duty": 0.3}, alerts={"alerts": duty}), "throttling") == []
    )


def test_throttling_reasons_are_the_alerts_reasons() -> None:
    # Without sw_power_cap in InferwatchGpuClocksThrottled's reasons, an active power cap is no finding.
    alerts = {"alerts": {"InferwatchGpuClocksThrottled": {"reasons": ["sw_thermal_slowdown"]}}}
    assert findings(run(5, gpus=lambda i: {"reasons": ("sw_power_cap",)}, alerts=alerts), "throttling") == []
    (finding,) = findings(run(5, gpus=lambda i: {"reasons": ("sw_power_cap",)}), "throttling")
    assert finding.severity == Severity.WARNING
    # Hardware slowdown is critical because the hardware slowdown alert lists it, not by its name.
    alerts = {"alerts": {"InferwatchGpuHardwareSlowdown": {"reasons": ["hw_thermal_slowdown"]}}}
    assert findings(run(5, gpus=lambda i: {"reasons": ("hw_slowdown",)}, alerts=alerts), "throttling") == []


def test_host_bound_follows_the_alert_configuration() -> None:
    quiet = {"alerts": {"InferwatchHostBound": {"busy_ratio_below": 0.1}}}
    assert findings(run(5, serving=lambda i: {"busy": 0.2}, alerts=quiet), "host-bound") == []
    # Steps count as loaded only with more requests running than the alert's requests_running_above.
    busy = {"alerts": {"InferwatchHostBound": {"requests_running_above": 1}}}
    diagnosis = run(5, serving=lambda i: {"busy": 0.2, "running": 1}, alerts=busy)
    assert "host-bound" in diagnosis.not_assessed


def test_low_device_memory() -> None:
    diagnosis = run(4, gpus=lambda i: {"free": 3e9})
    (finding,) = findings(diagnosis, "oom-risk")
    assert finding.severity == Severity.CRITICAL
    assert finding.evidence[0].value.startswith("3.8%")


def test_kv_headroom_under_the_alerts_threshold() -> None:
    # 3000 tokens: more than one request (64 + 25) needs, fewer than InferwatchKvCacheHeadroomLow's 4096.
    (finding,) = findings(run(4, serving=lambda i: {"headroom": 3000}), "oom-risk")
    assert finding.severity == Severity.WARNING
    assert finding.summary == "the KV cache has room for fewer than 4,096 more tokens"
    assert [e.value for e in finding.evidence] == ["3,000", "89"]
    assert findings(run(4, serving=lambda i: {"headroom": 5000}), "oom-risk") == []
    small = {"alerts": {"InferwatchKvCacheHeadroomLow": {"headroom_tokens_below": 1000}}}
    assert findings(run(4, serving=lambda i: {"headroom": 3000}, alerts=small), "oom-risk") == []


def test_kv_headroom_under_one_request() -> None:
    (finding,) = findings(run(4, serving=lambda i: {"headroom": 50}), "oom-risk")
    assert finding.summary == "the KV cache has less headroom than one average request needs"


def test_kv_headroom_of_a_paged_cache_points_at_the_paged_cache() -> None:
    # With continuous batching the headroom is what the free blocks hold: "use a paged KV cache" (the
    # MEMORY item) would be no advice; the paged cache's remedies are.
    (finding,) = findings(run(4, serving=lambda i: {"headroom": 3000, "blocks_used": 500}), "oom-risk")
    assert finding.checklist == kv_cache.REMEDIES
    assert checklist.MEMORY not in finding.checklist


def test_an_oom_is_critical() -> None:
    diagnosis = run(4, serving=lambda i: {"ooms": 1 if i == 2 else 0})
    (finding,) = findings(diagnosis, "oom-risk")
    assert finding.severity == Severity.CRITICAL
    assert "out-of-memory" in finding.summary


def test_memory_creeping_without_load_is_a_leak() -> None:
    diagnosis = run(10, serving=lambda i: {"rss": 1e9 * (1 + 0.02 * i)})
    (finding,) = findings(diagnosis, "leak")
    assert finding.subject == "process on node:8797"
    assert "serving process resident memory" in finding.summary
    assert "faster than 512.00 MiB/h" in finding.summary


def test_a_leak_is_growth_faster_than_the_leak_alert_allows() -> None:
    # InferwatchMemoryLeak: 512 MiB per hour, about 149 kB/s. One step is one second.
    slow, fast = (lambda i: {"rss": 1e9 + 140e3 * i}), (lambda i: {"rss": 1e9 + 160e3 * i})
    assert findings(run(10, serving=slow), "leak") == []
    assert len(findings(run(10, serving=fast), "leak")) == 1
    leak = {"alerts": {"InferwatchMemoryLeak": {"growth_bytes_above": 1 << 30, "lookback": "1h"}}}
    assert findings(run(10, serving=fast, alerts=leak), "leak") == []


def test_a_leak_is_judged_against_the_alerts_load_growth() -> None:
    # The token rate rises 15 % over the window: more than InferwatchMemoryLeak's 10 %, so not a leak.
    def rising(i: int) -> dict:
        return {"rss": 1e9 * (1 + 0.02 * i), "tokens": 100 if i < 4 else 115}

    assert findings(run(10, serving=rising), "leak") == []
    tolerant = {"alerts": {"InferwatchMemoryLeak": {"load_growth_ratio": 0.2}}}
    assert len(findings(run(10, serving=rising, alerts=tolerant), "leak")) == 1


def test_memory_growing_with_the_load_is_not_a_leak() -> None:
    diagnosis = run(10, serving=lambda i: {"rss": 1e9 * (1 + 0.02 * i), "tokens": 50 + 50 * i})
    assert findings(diagnosis, "leak") == []


def test_quadratic_prefill_is_flagged_with_its_exponent() -> None:
    prompt = [64, 16, 32, 64, 128, 256, 512]  # the first step only opens the window
    diagnosis = run(len(prompt), serving=lambda i: {"prompt": prompt[i], "prefill": 1e-6 * prompt[i] ** 2})
    (finding,) = findings(diagnosis, "scaling")
    assert finding.severity == Severity.WARNING
    assert float(finding.evidence[0].value) == pytest.approx(2.0, abs=0.3)


def test_bandwidth_bound_decode_is_information_not_an_alarm() -> None:
    diagnosis = run(4, serving=lambda i: {"bandwidth": 0.8})
    (finding,) = findings(diagnosis, "bandwidth-bound")
    assert finding.severity == Severity.INFO
    assert not diagnosis.alarming


def test_requests_waiting_at_capacity_is_queueing() -> None:
    # Eight requests wait (InferwatchRequestsQueueing: above 4) and each waits 1.5 s before its 20 ms
    # prefill, while the device is busy 90 % of the time: the model is at capacity.
    diagnosis = run(5, serving=lambda i: {"waiting": 8, "queue": 1.5, "busy": 0.9})
    (finding,) = findings(diagnosis, "queueing")
    assert finding.severity == Severity.WARNING
    assert finding.subject == "model m on node:8797"
    assert "at capacity" in finding.summary
    evidence = {e.what: e for e in finding.evidence}
    assert evidence["requests waiting (mean)"].value == "8"
    assert evidence["requests waiting (mean)"].query == "sum by (job, instance, model) (llm_requests_waiting)"
    # p99 inside the (1, 2] bucket: 1.99 s, above InferwatchQueueTimeHigh's 1 s.
    assert evidence["queue time p99 (mean)"].value == "1.99 s"
    assert evidence["queue share of time to first token"].value == "99%"
    assert evidence["device busy ratio (mean)"].value == "90%"
    assert [item.action for item in finding.checklist][:2] == [
        checklist.SCALE_OUT.action, checklist.BATCHING.action
    ]  # fmt: skip
    assert checklist.MAX_TOKENS in finding.checklist
    assert "host-bound" not in {f.check for f in diagnosis.findings}


def test_queue_share_of_ttft_counts_only_while_the_device_is_busy() -> None:
    # One request waiting and 80 ms of queue before a 20 ms prefill: 80 % of TTFT is queue.
    busy = run(5, serving=lambda i: {"waiting": 1, "queue": 0.08, "busy": 0.9})
    (finding,) = findings(busy, "queueing")
    assert [e.what for e in finding.evidence] == [
        "queue share of time to first token", "device busy ratio (mean)"
    ]  # fmt: skip
    assert finding.evidence[0].value == "80%"
    # The same share on a device busy 20 % of the time: set-up before a fast prefill, no queue (the
    # host-bound check speaks for that model).
    idle = run(5, serving=lambda i: {"waiting": 1, "queue": 0.08, "busy": 0.2})
    assert findings(idle, "queueing") == []
    assert "queueing" in idle.passed


def test_waiting_on_an_idle_device_points_at_the_host() -> None:
    diagnosis = run(5, serving=lambda i: {"waiting": 6, "busy": 0.2})
    (finding,) = findings(diagnosis, "queueing")
    assert "busy only 20%" in finding.summary
    assert finding.checklist[0] == checklist.OVERLAP


def test_queueing_thresholds_come_from_the_alert_configuration() -> None:
    alerts = {
        "alerts": {
            "InferwatchRequestsQueueing": {"requests_waiting_above": 10},
            "InferwatchQueueTimeHigh": {"seconds_above": 2.5},
        }
    }
    # 1.5 s of queue before a 2 s prefill: 43 % of TTFT, under this check's own 50 %.
    step = {"waiting": 8, "queue": 1.5, "prefill": 2.0, "busy": 0.9}
    assert findings(run(5, serving=lambda i: step, alerts=alerts), "queueing") == []
    assert findings(run(5, serving=lambda i: step), "queueing") != []


def test_queueing_without_arrivals_is_not_assessed() -> None:
    diagnosis = run(5, serving=lambda i: {})
    assert "llm_requests_waiting" in diagnosis.not_assessed["queueing"]


def test_launch_bound_is_nvml_utilization_without_sm_activity() -> None:
    # The H200's host-driven loop of 128² matmuls: NVML 20 %, SM active 2 %.
    diagnosis = run(5, serving=lambda i: {}, gpus=lambda i: {"utilization": 0.2, "sm_active": 0.02})
    (finding,) = findings(diagnosis, "launch-bound")
    assert finding.severity == Severity.WARNING
    assert finding.subject == "GPU 0 on node:8798"
    assert [e.value for e in finding.evidence] == ["2.0%", "20%", "90%"]
    assert finding.evidence[0].query == 'max by (instance, gpu, uuid) (gpu_sm_active_ratio{gpu_instance=""})'
    assert finding.evidence[2].query == "max by (instance, uuid) (llm_gpu_busy_ratio)"
    # The model on it, joined by the GPU's UUID: the serving endpoint is another instance.
    assert finding.summary.endswith("; it serves model m on node:8797")
    assert finding.checklist == (checklist.COMPILE, checklist.CUDA_GRAPHS, checklist.BATCHING)


def test_launch_bound_from_the_models_busy_ratio_alone() -> None:
    # NVML low (it samples coarsely), the model's forwards fill its wall time, the SMs idle.
    diagnosis = run(
        5, serving=lambda i: {"busy": 0.8}, gpus=lambda i: {"utilization": 0.05, "sm_active": 0.05}
    )
    (finding,) = findings(diagnosis, "launch-bound")
    assert "kernels run 80% of the time" in finding.summary


def test_busy_sms_or_an_idle_gpu_are_not_launch_bound() -> None:
    busy = run(5, serving=lambda i: {"busy": 0.95}, gpus=lambda i: {"utilization": 1.0, "sm_active": 0.96})
    idle = run(5, gpus=lambda i: {"utilization": 0.0, "sm_active": 0.0})
    assert findings(busy, "launch-bound") == findings(idle, "launch-bound") == []
    assert "launch-bound" in busy.passed and "launch-bound" in idle.passed


def test_without_gpm_launch_bound_and_tensor_cores_are_not_assessed() -> None:
    diagnosis = run(5, gpus=lambda i: {"sm_active": None})
    assert "GPM" in diagnosis.not_assessed["launch-bound"]
    assert "GPM" in diagnosis.not_assessed["tensor-cores"]


def test_tensor_cores_idle_while_the_sms_work_is_a_bf16_hint() -> None:
    diagnosis = run(5, gpus=lambda i: {"sm_active": 0.9, "tensor_active": 0.0, "fp32_active": 0.6})
    (finding,) = findings(diagnosis, "tensor-cores-idle")
    assert finding.severity == Severity.INFO
    assert [e.value for e in finding.evidence] == ["90%", "0.0%", "60%"]
    assert finding.checklist == (checklist.BF16,)
    assert not diagnosis.alarming


def test_tensor_cores_at_work_or_idle_sms_give_no_hint() -> None:
    working = run(5, gpus=lambda i: {"sm_active": 0.96, "tensor_active": 0.93})
    idle = run(5, gpus=lambda i: {"utilization": 0.0, "sm_active": 0.01, "tensor_active": 0.0})
    assert findings(working, "tensor-cores-idle") == findings(idle, "tensor-cores-idle") == []


def test_a_paged_kv_cache_nearly_full() -> None:
    # Requests hold 950 of 1000 blocks: above InferwatchKvCacheNearlyFull's 90 %.
    diagnosis = run(5, serving=lambda i: {"blocks_used": 950, "headroom": 800, "waiting": 6})
    (finding,) = findings(diagnosis, "kv-cache")
    assert finding.severity == Severity.WARNING
    assert finding.subject == "model m on node:8797"
    assert finding.summary.startswith("the paged KV cache is 95% full: new requests wait for free blocks")
    evidence = {e.what: e for e in finding.evidence}
    assert evidence["KV-cache blocks used (mean; now)"].value == "95%; 95%"
    assert evidence["KV-cache blocks used (mean; now)"].query == (
        'sum by (job, instance, model) (llm_kv_cache_blocks{state="used"})\n'
        '/ sum by (job, instance, model) (llm_kv_cache_blocks{state="total"})'
    )
    assert evidence["KV-cache headroom (tokens, now)"].value == "800"
    assert evidence["requests waiting (mean)"].value == "6"
    assert "requests preempted per second (mean)" not in evidence
    # More blocks, fewer tokens per step, shorter generations, more replicas; no CPU offload without
    # preemptions.
    assert finding.checklist == (
        checklist.KV_BLOCKS, checklist.MAX_BATCH_TOKENS, checklist.KV_MAX_NEW_TOKENS, checklist.SCALE_OUT
    )  # fmt: skip
    assert diagnosis.alarming


def test_a_kv_cache_full_only_at_a_peak_or_at_the_threshold_passes() -> None:
    # Exactly 90 %: the alert's `>` does not fire, nor does the check. One full step of five is a peak.
    assert findings(run(5, serving=lambda i: {"blocks_used": 900}), "kv-cache") == []
    peak = run(5, serving=lambda i: {"blocks_used": 1000 if i == 3 else 500})
    assert findings(peak, "kv-cache") == []
    assert "kv-cache" in peak.passed


def test_kv_cache_threshold_comes_from_the_alert_configuration() -> None:
    step = {"blocks_used": 850}
    assert findings(run(5, serving=lambda i: step), "kv-cache") == []
    lower = {"alerts": {"InferwatchKvCacheNearlyFull": {"used_ratio_above": 0.8}}}
    (finding,) = findings(run(5, serving=lambda i: step, alerts=lower), "kv-cache")
    assert "85% full" in finding.summary


def test_preemptions_are_a_finding_with_cpu_offload_among_the_remedies() -> None:
    # One preemption a second with 70 % of the blocks used: the scheduler frees blocks for a prompt.
    diagnosis = run(5, serving=lambda i: {"blocks_used": 700, "preemptions": 1})
    (finding,) = findings(diagnosis, "kv-cache")
    assert finding.summary.startswith("the continuous-batching scheduler preempts requests")
    evidence = {e.what: e for e in finding.evidence}
    assert evidence["requests preempted per second (mean)"].value == "1"
    assert evidence["requests preempted per second (mean)"].query == (
        "sum by (job, instance, model) (rate(llm_kv_cache_preemptions_total[1s]))"
    )
    assert evidence["KV-cache blocks used (mean; now)"].value == "70%; 70%"
    assert finding.checklist[-1] == checklist.CPU_OFFLOAD
    # Full and preempting: one finding that says both.
    (both,) = findings(run(5, serving=lambda i: {"blocks_used": 990, "preemptions": 2}), "kv-cache")
    assert both.summary.startswith("the paged KV cache is 99% full and the scheduler preempts requests")


def test_preemptions_are_judged_against_the_preemption_alert() -> None:
    # InferwatchKvCachePreemptions with 600 per 5m allows 2 a second: 1 a second is no finding.
    tolerant = {"alerts": {"InferwatchKvCachePreemptions": {"preemptions_above": 600, "window": "5m"}}}
    step = {"blocks_used": 700, "preemptions": 1}
    assert findings(run(5, serving=lambda i: step, alerts=tolerant), "kv-cache") == []
    assert len(findings(run(5, serving=lambda i: step), "kv-cache")) == 1


def test_models_without_a_paged_kv_cache_are_not_assessed() -> None:
    # A model served by generate: no blocks, and a preemption counter that stays at zero.
    diagnosis = run(5, serving=lambda i: {"headroom": 50000, "preemptions": 0})
    assert findings(diagnosis, "kv-cache") == []
    assert "llm_kv_cache_blocks" in diagnosis.not_assessed["kv-cache"]
    assert "continuous batching" in diagnosis.not_assessed["kv-cache"]


def test_a_model_is_tied_to_its_gpu_under_its_own_group_with_or_without_job() -> None:
    """From Prometheus a model's groups carry ``job``, from a scrape they do not: either way the GPU is
    found under the group the model's other series have (queries.MODEL)."""
    from_prometheus = (("instance", "h:1"), ("job", "llm"), ("model", "m"), ("uuid", "GPU-1"))
    scraped = (("instance", "h:2"), ("model", "m"), ("uuid", "GPU-2"))
    on_cpu = (("instance", "h:3"), ("model", "m"))
    assert model_gpus([from_prometheus, scraped, on_cpu]) == {
        (("instance", "h:1"), ("job", "llm"), ("model", "m")): "GPU-1",
        (("instance", "h:2"), ("model", "m")): "GPU-2",
    }
