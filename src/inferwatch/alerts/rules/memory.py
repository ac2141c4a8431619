"""OOM risk: KV-cache headroom, a paged KV cache nearly full or preempting requests, device memory filling
up, allocator retries, out-of-memory errors, leaks."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_MODEL, PER_TARGET, eq, num

from .base import (
    GPU,
    MODEL,
    VALUE,
    VALUE_BYTES,
    VALUE_PERCENT,
    AlertGroup,
    AlertRule,
    Params,
    events_above,
    label,
)

GROUP = AlertGroup("inferwatch-memory")


@GROUP.alert("InferwatchKvCacheHeadroomLow")
def _kv_cache_headroom_low(p: Params) -> list[AlertRule]:
    headroom = p.serving(names.LLM_KV_CACHE_HEADROOM_TOKENS)
    return [
        p.rule(
            headroom.lt(p["headroom_tokens_below"]),
            f"Only {VALUE} more KV-cache tokens fit on the device of {MODEL}.",
            f"The KV cache of {MODEL} has room for only {VALUE} more tokens (threshold "
            f"{num(p['headroom_tokens_below'])}), for more than {p['for']}: in free device memory, or with "
            "continuous batching in the free and prefix-cached blocks of its paged cache. A longer prompt "
            "or a bigger batch runs out of memory; a paged cache makes it wait for blocks, or preempts "
            "running requests.",
        )
    ]


@GROUP.alert("InferwatchKvCacheNearlyFull")
def _kv_cache_nearly_full(p: Params) -> list[AlertRule]:
    # Only a paged KV cache (continuous batching) has blocks: models without one have no series here.
    # "used" blocks are the requests': prefix-cached ones are given to requests that need room.
    used = p.serving(names.LLM_KV_CACHE_BLOCKS, eq("state", "used"))
    total = p.serving(names.LLM_KV_CACHE_BLOCKS, eq("state", "total"))
    share = promql.aggregate("sum", used, PER_MODEL) / promql.aggregate("sum", total, PER_MODEL)
    expr = share.gt(p["used_ratio_above"])
    return [
        p.rule(
            expr,
            f"The paged KV cache of {MODEL} is {VALUE_PERCENT} full.",
            f"Requests running on {MODEL} hold {VALUE_PERCENT} of its paged KV-cache blocks (threshold "
            f"{num(p['used_ratio_above'] * 100)}%), for more than {p['for']} (blocks its prefix cache keeps "
            "are not counted: they go to requests that need room): the continuous-batching scheduler admits "
            "new requests only as blocks free up, and takes running requests off the device (preempts them) "
            "when a step finds no free block.",
        )
    ]


@GROUP.alert("InferwatchKvCachePreemptions")
def _kv_cache_preemptions(p: Params) -> list[AlertRule]:
    preemptions = p.serving(names.LLM_KV_CACHE_PREEMPTIONS_TOTAL)
    started = p.serving(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(preemptions, started, window, p["preemptions_above"], by=PER_MODEL),
            f"The continuous-batching scheduler of {MODEL} keeps preempting requests.",
            f"The scheduler of {MODEL} took {VALUE} requests off the device in the last {window} to free "
            f"KV-cache blocks (threshold {num(p['preemptions_above'])}), in every such window for more "
            f"than {p['for']}. A preempted request loses its cache: its prompt and tokens so far are "
            "computed again (or copied back from host memory), so its latency jumps and the device repeats "
            "work.",
        )
    ]


@GROUP.alert("InferwatchGpuMemoryFillingUp")
def _gpu_memory_filling_up(p: Params) -> list[AlertRule]:
    used = p.exporter(names.GPU_MEMORY_USED_BYTES)
    total = p.exporter(names.GPU_MEMORY_TOTAL_BYTES)
    horizon = p["horizon_window"]
    seconds = promql.Number(parse_duration(horizon, promql=True))
    predicted = promql.Call("predict_linear", (promql.Range(used, p["window"]), seconds))
    expr = predicted.gt(total).and_((used / total).gt(p["used_ratio_above"]))
    return [
        p.rule(
            expr,
            f"{GPU} runs out of memory within {horizon} at the current rate.",
            f"Used memory of {GPU} is above {num(p['used_ratio_above'] * 100)}% and its trend over the "
            f"last {p['window']} reaches {VALUE_BYTES}, more than the device holds, within {horizon}.",
        )
    ]


@GROUP.alert("InferwatchAllocatorRetries")
def _allocator_retries(p: Params) -> list[AlertRule]:
    # torch's count of this process (from 0 at its start), so a restart of the process restarts it.
    retries = p.serving(names.LLM_TORCH_ALLOC_RETRIES_TOTAL)
    started = p.serving(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(retries, started, window, p["retries_above"]),
            f"The CUDA allocator on {label('device')} of {label('instance')} keeps retrying allocations.",
            f"torch's caching allocator on {label('device')} of {label('instance')} freed its cache and "
            f"retried a failed allocation {VALUE} times in the last {window} (threshold "
            f"{num(p['retries_above'])}). Each retry stalls the step; it is the early sign of an "
            "out-of-memory error.",
        )
    ]


@GROUP.alert("InferwatchOutOfMemory")
def _out_of_memory(p: Params) -> list[AlertRule]:
    ooms = p.serving(names.LLM_OOM_EVENTS_TOTAL)
    started = p.serving(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(ooms, started, window, 0),
            f"{MODEL} ran out of device memory.",
            f"Out-of-memory errors raised by {MODEL} in the last {window}: {VALUE}. The requests that "
            "hit them failed.",
        )
    ]


@GROUP.alert("InferwatchMemoryLeak")
def _memory_leak(p: Params) -> list[AlertRule]:
    allocated = p.serving(names.LLM_TORCH_MEMORY_BYTES, eq("kind", "allocated"))
    tokens = p.serving(names.LLM_GENERATION_TOKENS_TOTAL)
    floor, lookback = p["floor_window"], p["lookback"]
    growth = promql.over_time("min", allocated, floor) - promql.over_time("min", allocated, floor, lookback)
    load_now = promql.aggregate("sum", promql.rate(tokens, floor), PER_TARGET)
    load_before = promql.aggregate("sum", promql.rate(tokens, floor, lookback), PER_TARGET)
    expr = growth.gt(p["growth_bytes_above"]).and_(
        load_now.le((1 + p["load_growth_ratio"]) * load_before), on=PER_TARGET
    )
    return [
        p.rule(
            expr,
            f"Allocated memory on {label('device')} of {label('instance')} creeps up without more load.",
            f"The lowest allocated memory on {label('device')} of {label('instance')} over {floor} grew "
            f"by {VALUE_BYTES} in {lookback}, while the token rate did not rise by more than "
            f"{num(p['load_growth_ratio'] * 100)}%: memory that is not released between requests (a "
            "leak) ends in an out-of-memory error.",
        )
    ]
