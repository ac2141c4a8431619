"""The monitoring's own health: scrape targets, the exporter's collections, NVML and instrumentation
errors."""

from __future__ import annotations

from ..grafana import PanelSpec, Query, above, below
from .queries import INSTANCE, alert_settings, sel, summed


def targets_up() -> PanelSpec:
    return PanelSpec(
        "Scrape targets up",
        "1 while Prometheus scrapes the target; InferwatchTargetDown fires after a sustained 0.",
        "none",
        below(1),
        [Query(sel("up", INSTANCE), "{{job}} {{instance}}")],
    )


def collection_age() -> PanelSpec:
    limit = alert_settings("InferwatchExporterCollectionStale")["age_seconds_above"]
    return PanelSpec(
        "Exporter collection age and duration",
        f"Seconds since the exporter's last complete collection (InferwatchExporterCollectionStale fires "
        f"above {limit} s) and how long the last one took.",
        "s",
        above(limit),
        [
            Query(
                f"time() - {sel('inferwatch_exporter_last_collect_timestamp_seconds', INSTANCE)}",
                "age {{instance}}",
            ),
            Query(sel("inferwatch_exporter_collect_duration_seconds", INSTANCE), "duration {{instance}}"),
        ],
    )


def monitor_errors() -> PanelSpec:
    return PanelSpec(
        "NVML and instrumentation errors",
        "Failed NVML calls in the exporter (not_supported is counted once per GPU) and errors the "
        "instrumentation caught in the serving process, per second.",
        "cps",
        above(0.01),
        [
            Query(
                summed("rate", "inferwatch_exporter_nvml_errors_total", INSTANCE, "instance, call, error"),
                "NVML {{call}} {{error}}",
            ),
            Query(
                summed("rate", "llm_instrumentation_errors_total", INSTANCE, "instance, stage"),
                "instrumentation {{stage}} {{instance}}",
            ),
        ],
    )
