"""The monitoring itself: scrape targets down or absent, a stale or slow exporter, NVML, instrumentation
errors."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import Matcher, num

from .base import VALUE, VALUE_DURATION, AlertGroup, AlertRule, Params, events_above, label

GROUP = AlertGroup("inferwatch-monitor")


def absent(selector: promql.Selector) -> promql.Call:
    return promql.Call("absent", (selector,))


@GROUP.alert("InferwatchTargetDown")
def _target_down(p: Params) -> list[AlertRule]:
    return [
        p.rule(
            p.exporter(names.UP).eq(0).or_(p.serving(names.UP).eq(0)),
            f"Prometheus cannot scrape {label('job')} at {label('instance')}.",
            f"Scrapes of {label('instance')} (job {label('job')}) have failed for more than {p['for']}: "
            "its metrics, and every alert that reads them, are blind.",
        )
    ]


@GROUP.alert("InferwatchTargetAbsent")
def _target_absent(p: Params) -> list[AlertRule]:
    return [
        p.rule(
            absent(p.exporter(names.UP)).or_(absent(p.serving(names.UP))),
            f"No scrape target of job {label('job')} exists.",
            f"Prometheus has had no target of job {label('job')} for more than {p['for']}: service "
            "discovery lost it or the job was renamed, and the alerts that read it cannot fire.",
        )
    ]


@GROUP.alert("InferwatchExporterCollectionStale")
def _exporter_collection_stale(p: Params) -> list[AlertRule]:
    last = p.exporter(names.INFERWATCH_EXPORTER_LAST_COLLECT_TIMESTAMP_SECONDS)
    return [
        p.rule(
            (promql.time() - last).gt(p["age_seconds_above"]),
            f"The exporter on {label('instance')} serves data {VALUE_DURATION} old.",
            f"The last complete collection of the exporter on {label('instance')} finished "
            f"{VALUE_DURATION} ago (threshold {num(p['age_seconds_above'])}s): its series are stale, "
            "probably because NVML hangs.",
        )
    ]


@GROUP.alert("InferwatchExporterCollectionSlow")
def _exporter_collection_slow(p: Params) -> list[AlertRule]:
    overruns = p.exporter(names.INFERWATCH_EXPORTER_COLLECTION_OVERRUNS_TOTAL)
    started = p.exporter(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(overruns, started, window, p["overruns_above"]),
            f"Collections of the exporter on {label('instance')} take longer than its interval.",
            f"{VALUE} collections of the exporter on {label('instance')} were still running when the "
            f"next was due in the last {window} (threshold {num(p['overruns_above'])}): readings arrive "
            "late and less often than configured.",
        )
    ]


@GROUP.alert("InferwatchNvmlDown")
def _nvml_down(p: Params) -> list[AlertRule]:
    up = p.exporter(names.INFERWATCH_NVML_UP)
    return [
        p.rule(
            up.eq(0),
            f"The exporter on {label('instance')} cannot use NVML.",
            f"NVML has not been initialised in the exporter on {label('instance')} for more than "
            f"{p['for']}: no GPU metric is collected (driver missing, not mounted into the container, or "
            "the driver/library versions differ).",
        )
    ]


@GROUP.alert("InferwatchNvmlErrors")
def _nvml_errors(p: Params) -> list[AlertRule]:
    errors = p.exporter(names.INFERWATCH_EXPORTER_NVML_ERRORS_TOTAL, Matcher("error", "not_supported", "!="))
    started = p.exporter(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(errors, started, window, p["errors_above"], by=("job", "instance", "call")),
            f"NVML call {label('call')} keeps failing on {label('instance')}.",
            f"NVML call {label('call')} failed {VALUE} times in the last {window} on {label('instance')} "
            f"(threshold {num(p['errors_above'])}); the series it feeds are missing.",
        )
    ]


@GROUP.alert("InferwatchInstrumentationErrors")
def _instrumentation_errors(p: Params) -> list[AlertRule]:
    errors = p.serving(names.LLM_INSTRUMENTATION_ERRORS_TOTAL)
    started = p.serving(names.PROCESS_START_TIME_SECONDS)
    window = p["window"]
    return [
        p.rule(
            events_above(errors, started, window, p["errors_above"], by=("job", "instance", "stage")),
            f"inferwatch's instrumentation fails at {label('stage')} on {label('instance')}.",
            f"The instrumentation in the serving process on {label('instance')} caught {VALUE} errors "
            f"at stage {label('stage')} in the last {window}. The model kept running, but the metrics "
            "of that stage are incomplete.",
        )
    ]
