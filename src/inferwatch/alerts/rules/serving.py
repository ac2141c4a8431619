"""Serving: a host-bound model, a serving process that saturates its CPU core, a stalled engine, a request
that has run too long, requests queueing for a model."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import PER_MODEL, num

from .base import (
    MODEL,
    VALUE,
    VALUE_DURATION,
    VALUE_PERCENT,
    AlertGroup,
    AlertRule,
    Params,
    label,
)

GROUP = AlertGroup("inferwatch-serving")


@GROUP.alert("InferwatchHostBound")
def _host_bound(p: Params) -> list[AlertRule]:
    busy = p.serving(names.LLM_GPU_BUSY_RATIO)
    running = p.serving(names.LLM_REQUESTS_RUNNING)
    window = p["window"]
    in_flight = promql.over_time("avg", running, window).gt(p["requests_running_above"])
    expr = busy.lt(p["busy_ratio_below"]).and_(in_flight, on=PER_MODEL)
    return [
        p.rule(
            expr,
            f"{MODEL} keeps its GPU busy only {VALUE_PERCENT} of the time while serving.",
            f"The GPU ({label('device')}, {label('uuid')}) ran the kernels of {MODEL}'s serving process for "
            f"only {VALUE_PERCENT} of wall time (NVML, {label('source')} utilization; threshold "
            f"{num(p['busy_ratio_below'] * 100)}%) while requests were in flight, for more than {p['for']}. "
            "The GPU waits for the host: Python overhead, kernel launches, tokenization, sampling or data "
            "loading sit between the kernels.",
        )
    ]


@GROUP.alert("InferwatchServingProcessCpuSaturated")
def _serving_cpu_saturated(p: Params) -> list[AlertRule]:
    cpu = p.exporter(names.INFERWATCH_PROCESS_CPU_SECONDS_TOTAL)
    window = p["window"]
    process = f"Serving process {label('comm')} (pid {label('pid')}) on {label('instance')}"
    return [
        p.rule(
            promql.sum_rate(cpu, ("job", "instance", "pid", "comm"), window).gt(p["cpu_cores_above"]),
            f"{process} uses {VALUE} CPU cores.",
            f"{process} used {VALUE} CPU seconds per second (user and system) over the "
            f"last {window} (threshold {num(p['cpu_cores_above'])}): a Python serving loop is bound to one "
            "core, so the host, not the GPU, limits throughput.",
        )
    ]


@GROUP.alert("InferwatchEngineStalled")
def _engine_stalled(p: Params) -> list[AlertRule]:
    last_step = p.serving(names.LLM_LAST_STEP_TIMESTAMP_SECONDS)
    running = p.serving(names.LLM_REQUESTS_RUNNING)
    expr = (promql.time() - last_step).gt(p["stall_seconds_above"]).and_(running.gt(0), on=PER_MODEL)
    return [
        p.rule(
            expr,
            f"{MODEL} has made no progress for {VALUE_DURATION}.",
            f"{MODEL} has requests in flight but ran no forward pass for {VALUE_DURATION} (threshold "
            f"{num(p['stall_seconds_above'])}s): the engine is hung.",
        )
    ]


@GROUP.alert("InferwatchRequestStuck")
def _request_stuck(p: Params) -> list[AlertRule]:
    age = p.serving(names.LLM_REQUEST_OLDEST_RUNNING_AGE_SECONDS)
    expr = promql.aggregate("max", age, PER_MODEL).gt(p["age_seconds_above"])
    return [
        p.rule(
            expr,
            f"A request to {MODEL} has been running for {VALUE_DURATION}.",
            f"The oldest request running on {MODEL} arrived {VALUE_DURATION} ago (threshold "
            f"{num(p['age_seconds_above'])}s). Whether or not it still makes progress, it holds its place "
            "on the server: a sequential server (transformers serve without continuous batching) serves "
            "nobody else until it ends.",
        )
    ]


@GROUP.alert("InferwatchRequestsQueueing")
def _requests_queueing(p: Params) -> list[AlertRule]:
    waiting = p.serving(names.LLM_REQUESTS_WAITING)
    window = p["window"]
    waiting_mean = promql.aggregate("sum", promql.over_time("avg", waiting, window), PER_MODEL)
    expr = waiting_mean.gt(p["requests_waiting_above"])
    return [
        p.rule(
            expr,
            f"{VALUE} requests wait for {MODEL}.",
            f"On average {VALUE} requests waited for {MODEL} to start generating over the last {window} "
            f"(threshold {num(p['requests_waiting_above'])}), for more than {p['for']}. Requests arrive "
            "faster than the model serves them: each one's time to first token includes its wait.",
        )
    ]
