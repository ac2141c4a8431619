"""The monitoring's own health: scrape targets, the exporter's collections, NVML and instrumentation
errors."""

from __future__ import annotations

from inferwatch.common import names, promql
from inferwatch.common.promql import PER_TARGET

from ..grafana import PanelSpec, above, below
from .queries import alert_settings, exporter_instance, query, serving_instance


def targets_up() -> PanelSpec:
    return PanelSpec(
        "Scrape targets up",
        "1 while Prometheus scrapes the target; InferwatchTargetDown fires after a sustained 0.",
        "none",
        below(1),
        [query(exporter_instance(names.UP).or_(serving_instance(names.UP)), "{{job}} {{instance}}")],
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
            query(
                promql.time() - exporter_instance(names.INFERWATCH_EXPORTER_LAST_COLLECT_TIMESTAMP_SECONDS),
                "age {{instance}}",
            ),
            query(
                exporter_instance(names.INFERWATCH_EXPORTER_COLLECT_DURATION_SECONDS), "duration {{instance}}"
            ),
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
            query(
                promql.sum_rate(
                    exporter_instance(names.INFERWATCH_EXPORTER_NVML_ERRORS_TOTAL),
                    (*PER_TARGET, "call", "error"),
                ),
                "NVML {{call}} {{error}}",
            ),
            query(
                promql.sum_rate(
                    serving_instance(names.LLM_INSTRUMENTATION_ERRORS_TOTAL), (*PER_TARGET, "stage")
                ),
                "instrumentation {{stage}} {{instance}}",
            ),
        ],
    )
