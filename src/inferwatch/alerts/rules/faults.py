"""GPU faults: critical XIDs, uncorrectable ECC errors, row remapping, a lost GPU, fewer GPUs than before."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_TARGET, eq, one_of, regex

from .base import GPU, VALUE, VALUE_DURATION, AlertGroup, AlertRule, Params, label

GROUP = AlertGroup("inferwatch-gpu-faults")


@GROUP.alert("InferwatchGpuXidError")
def _gpu_xid_error(p: Params) -> list[AlertRule]:
    # The time of the code's last XID, not a rise of its counter: it says "an XID within the window"
    # whatever the series did before (born at 1, come back at the same count after a restart of the
    # exporter without a state directory, absent at the window's start), so no XID goes unpaged
    # (docs/alerts.md, "XIDs across exporter restarts"). The value is how long ago it was.
    last = p.exporter(names.GPU_XID_LAST_TIMESTAMP_SECONDS, regex("xid", one_of(p["xids"])))
    window = p["window"]
    ago = promql.time() - last
    return [
        p.rule(
            ago.lt(parse_duration(window, promql=True)),
            f"{GPU} reported XID {label('xid')}.",
            f"{GPU} reported XID {label('xid')} {VALUE_DURATION} ago (an XID of this code within the last "
            f"{window}). This XID means a hardware, driver or firmware fault; the GPU may need a reset or "
            "service. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuUncorrectableEccErrors")
def _gpu_uncorrectable_ecc(p: Params) -> list[AlertRule]:
    # Volatile counts move at once; aggregate ones count the same errors again, later.
    errors = p.exporter(names.GPU_ECC_ERRORS_TOTAL, eq("type", "uncorrected"), eq("scope", "volatile"))
    window = p["window"]
    return [
        p.rule(
            promql.increase(errors, window).gt(0),
            f"{GPU} had uncorrectable ECC errors.",
            f"{GPU} counted {VALUE} uncorrectable ECC errors in the last {window}. "
            "Data in device memory was corrupted; processes using it may have crashed or computed "
            "wrong results. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuRowRemapFailure")
def _gpu_row_remap_failure(p: Params) -> list[AlertRule]:
    failure = p.exporter(names.GPU_REMAPPED_ROWS_FAILED)
    return [
        p.rule(
            failure.eq(1),
            f"{GPU} failed to remap a memory row.",
            f"{GPU} reports a row-remapping failure: a bad memory row could not be replaced by a spare. "
            "The GPU needs service. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuRowRemapPending")
def _gpu_row_remap_pending(p: Params) -> list[AlertRule]:
    pending = p.exporter(names.GPU_REMAPPED_ROWS_PENDING)
    return [
        p.rule(
            pending.eq(1),
            f"{GPU} needs a reset to remap a memory row.",
            f"{GPU} has had a row remapping pending for more than {p['for']}: it takes effect at the next "
            "GPU reset, until then the bad row is still in use. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuLost")
def _gpu_lost(p: Params) -> list[AlertRule]:
    up = p.exporter(names.GPU_UP)
    return [
        p.rule(
            up.eq(0),
            f"{GPU} does not answer.",
            f"The exporter could not read {GPU} for more than {p['for']}: it fell off the bus, hung, or "
            "NVML fails on it. " + p.gpu_users(),
        )
    ]


@GROUP.alert("InferwatchGpuCountDropped")
def _gpu_count_dropped(p: Params) -> list[AlertRule]:
    info = p.exporter(names.GPU_INFO)
    up = p.exporter(names.UP)
    lookback = p["lookback"]
    gpus = promql.aggregate("count", info, PER_TARGET)
    # An exporter that is up and sees no GPU counts zero, not nothing.
    now = gpus.or_(0 * up.eq(1), on=PER_TARGET)
    most = promql.Call("max_over_time", (promql.Subquery(gpus, lookback, "5m"),))
    expr = now.lt(most)
    return [
        p.rule(
            expr,
            f"{label('instance')} sees fewer GPUs than before.",
            f"{label('instance')} now sees {VALUE} GPUs, fewer than it saw at some point in the last "
            f"{lookback}: a GPU fell off the bus or the driver no longer enumerates it.",
        )
    ]
