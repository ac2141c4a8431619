"""The monitoring's own health: scrape targets, the exporter's collections, NVML and instrumentation
errors."""

from __future__ import annotations

from inferwatch.common import names

from ..grafana import PanelSpec, Query, above, below
from .queries import INSTANCE, alert_settings, sel, summed


def targets_up() -> PanelSpec:
    return PanelSpec(
        "Scrape targets up",
        "1 while Prometheus scrapes the target; InferwatchTargetDown fires after a sustained 0.",
        "none",
        below(1),
        [Query(sel(names.UP, INSTANCE), "{{job}} {{instance}}")],
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
                f"time() - {sel(names.INFERWATCH_EXPORTER_LAST_COLLECT_TIMESTAMP_SECONDS, INSTANCE)}",
                "age {{instance}}",
            ),
            Query(sel(names.INFERWATCH_EXPORTER_COLLECT_DURATION_SECONDS, INSTANCE), "duration {{instance}}"),
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
                summed(
                    "rate", names.INFERWATCH_EXPORTER_NVML_ERRORS_TOTAL, INSTANCE, "instance, call, error"
                ),
                "NVML {{call}} {{error}}",
            ),
            Query(
                summed("rate", names.LLM_INSTRUMENTATION_ERRORS_TOTAL, INSTANCE, "instance, stage"),
                "instrumentation {{stage}} {{instance}}",
            ),
        ],
    )
