"""Small builders over grafana-foundation-sdk: the few panel shapes inferwatch's dashboards are made of.

Every panel built here reads the ``$datasource`` variable, states a unit and thresholds (a panel without a
unit is a number nobody can read; thresholds mark where an alert would fire, or at least color the
normal range), and shows its legend. Queries are :class:`Query` values so the tests can reach every
expression of every panel without walking Grafana's JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

DATASOURCE = common.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana picks a rate window of at least four scrape intervals; every range selector uses it.
RATE = "$__rate_interval"

GREEN, YELLOW, RED = "green", "yellow", "red"

PanelT = TypeVar("PanelT", timeseries.Panel, stat.Panel, statetimeline.Panel)


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel: the expression and how its series are named in the legend."""

    expr: str
    legend: str


Step = tuple[float | None, str]


def steps(*pairs: Step) -> list[models.Threshold]:
    """Threshold steps from (value, color) pairs; the first value is None (the base color)."""
    return [models.Threshold(value=value, color=color) for value, color in pairs]


def above(limit: float, base: str = GREEN, over: str = RED) -> list[models.Threshold]:
    """Thresholds marking values from ``limit`` up."""
    return steps((None, base), (limit, over))


def below(limit: float) -> list[models.Threshold]:
    """Thresholds marking values under ``limit``."""
    return steps((None, RED), (limit, GREEN))


def normal() -> list[models.Threshold]:
    """Thresholds for a quantity with no alerting level: one base color."""
    return steps((None, GREEN))


@dataclass(frozen=True)
class PanelSpec:
    """What a panel shows, independent of its type: title, text, unit, thresholds and queries."""

    title: str
    description: str
    unit: str
    thresholds: list[models.Threshold]
    queries: Sequence[Query]


def _targets(queries: Sequence[Query]) -> list[cog.Builder[prometheus.Dataquery]]:
    return [
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .expr(query.expr)
        .legend_format(query.legend)
        .ref_id(chr(ord("A") + index))
        for index, query in enumerate(queries)
    ]


def _threshold_config(spec: PanelSpec) -> dashboard_builders.ThresholdsConfig:
    return dashboard_builders.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps(spec.thresholds)


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
    )


def _described(panel: PanelT, spec: PanelSpec, width: int, height: int) -> PanelT:
    """What every panel shares: title, description, data source, queries, unit, thresholds and size."""
    return (
        panel.title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .targets(_targets(spec.queries))
        .unit(spec.unit)
        .thresholds(_threshold_config(spec))
        .span(width)
        .height(height)
    )


def timeseries_panel(
    spec: PanelSpec,
    *,
    width: int = 12,
    height: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    stacked: bool = False,
    no_value: str | None = None,
) -> timeseries.Panel:
    """A time series; thresholds are drawn as dashed lines when there is more than a base color.
    ``no_value``: what the panel says where no series exists (a feature the models do not use)."""
    panel = _described(timeseries.Panel(), spec, width, height).legend(_legend())
    if no_value is not None:
        panel = panel.no_value(no_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if len(spec.thresholds) > 1:
        panel = panel.thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    if min_value is not None:
        panel = panel.min(min_value)
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        ).fill_opacity(30)
    return panel


def stat_panel(spec: PanelSpec, *, width: int = 6, height: int = 8) -> stat.Panel:
    """A single number per series (the last value), colored by the thresholds."""
    return (
        _described(stat.Panel(), spec, width, height)
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
    )


def state_timeline_panel(
    spec: PanelSpec, states: dict[str, tuple[str, str]], *, width: int = 12, height: int = 8
) -> statetimeline.Panel:
    """Discrete states over time: ``states`` maps a value to its (text, color)."""
    mapping = models.ValueMap(
        options={
            value: models.ValueMappingResult(text=text, color=color)
            for value, (text, color) in states.items()
        }
    )
    return _described(statetimeline.Panel(), spec, width, height).mappings([mapping]).legend(_legend())


def query_variable(name: str, label: str, query: str) -> dashboard_builders.QueryVariable:
    """A multi-value variable from label values, with an "All" that matches everything (``.*``)."""
    return (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .definition(query)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(models.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )


def datasource_variable() -> dashboard_builders.DatasourceVariable:
    return dashboard_builders.DatasourceVariable("datasource").label("Data source").type("prometheus")
