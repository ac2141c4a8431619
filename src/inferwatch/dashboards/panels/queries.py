"""How every panel queries: the configured job selectors and the dashboard variables every selector
carries, percentiles, means, rates, and the alert defaults that set the thresholds.

Expressions are built with :mod:`inferwatch.common.promql`, the vocabulary of the alerts and the monitor,
and rendered with Grafana's ``$__rate_interval`` as the window of every range. The conventions (the ones
the anchors' dashboards get wrong):

* every selector starts with the configured matchers of its job (``selectors`` of alerts/config.yaml, the
  mixin's job selectors), then the dashboard variables it can be filtered by;
* per-model quantities are grouped per :data:`~inferwatch.common.promql.PER_MODEL` (``job, instance,
  model``), as the recording rules and alerts group them: a panel's line is the series an alert judges;
* percentiles are ``histogram_quantile`` over ``sum by (job, instance, model, le) (rate(X_bucket[...]))``,
  never quantiles averaged or added; means are ``sum(rate(X_sum)) / sum(rate(X_count))``, never an
  average of averages; counters are only read through ``rate``/``increase``.

Thresholds that correspond to an alert come from the alert's configuration (alerts/config.yaml, or the
file given to ``inferwatch dashboards generate --config``), so a panel turns red where the alert fires.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

from inferwatch.alerts.config import Selectors, merge_config
from inferwatch.alerts.rules.recording import quantile_record
from inferwatch.common import names, promql
from inferwatch.common.promql import PER_MODEL, Matcher, Selector, eq, num, regex

from ..grafana import RATE, Query

# The dashboard variables, as matchers (multi-value: a regex; "All" is ".*").
MODEL_VARIABLE = regex("model", "$model")
INSTANCE_VARIABLE = regex("instance", "$instance")
GPU_VARIABLE = regex("gpu", "$gpu")

QUANTILES = (0.5, 0.9, 0.99)
# The legend of a per-model series.
MODEL_LEGEND = "{{model}} {{instance}}"


# The alerts configuration the panels are built from: the bundled defaults unless :func:`configured`.
_CONFIG: ContextVar[Mapping[str, Any] | None] = ContextVar("dashboards_alerts_config", default=None)


@contextmanager
def configured(config: Mapping[str, Any] | None) -> Iterator[None]:
    """Build panels from ``config`` (a validated alerts configuration: its selectors, thresholds and
    windows; None: the bundled defaults), as the rules rendered from the same file are."""
    token = _CONFIG.set(config)
    try:
        yield
    finally:
        _CONFIG.reset(token)


@cache
def _defaults() -> Mapping[str, Any]:
    return merge_config({})


def _config() -> Mapping[str, Any]:
    return _CONFIG.get() or _defaults()


def alert_settings(name: str) -> Mapping[str, Any]:
    """The settings of alert ``name`` (alerts/config.yaml, or the configuration in use)."""
    return _config()["alerts"][name]


def recorded_quantiles() -> list[float]:
    """The quantiles the recording rules record (``recording.quantiles`` of the configuration in use)."""
    return list(_config()["recording"]["quantiles"])


def recorded_quantile(metric: str, quantile: float, legend: str) -> Query:
    """The recorded ``quantile`` of histogram ``metric`` per job and model over every instance (the
    recording rules' ``job_model:<metric>:quantile_rate<window>``; the instance variable does not apply):
    one line per model however many replicas serve it, read instead of computed."""
    window = _config()["recording"]["quantile_window"]
    recorded = selectors().for_serving(
        quantile_record(metric, window), MODEL_VARIABLE, eq("quantile", num(quantile))
    )
    return query(recorded, legend)


def selectors() -> Selectors:
    """The configured job selectors (``selectors`` of the configuration in use)."""
    return Selectors.of(_config())


def serving(metric: str, *matchers: Matcher) -> Selector:
    """``metric`` of the selected models on the selected instances (llm_* series)."""
    return selectors().for_serving(metric, MODEL_VARIABLE, INSTANCE_VARIABLE, *matchers)


def serving_instance(metric: str, *matchers: Matcher) -> Selector:
    """``metric`` of serving processes on the selected instances, for series without a model label."""
    return selectors().for_serving(metric, INSTANCE_VARIABLE, *matchers)


def gpu(metric: str, *matchers: Matcher) -> Selector:
    """``metric`` of the selected GPUs on the selected exporters (gpu_* series)."""
    return selectors().for_exporter(metric, INSTANCE_VARIABLE, GPU_VARIABLE, *matchers)


def models_gpu(metric: str, *matchers: Matcher) -> Selector:
    """The GPU side of a join onto each model's GPU (:func:`on_models_gpu`): found by UUID on whichever
    exporter has it, so the instance variable (the model's serving endpoint) does not apply."""
    return selectors().for_exporter(metric, GPU_VARIABLE, *matchers)


def exporter_instance(metric: str, *matchers: Matcher) -> Selector:
    """``metric`` of the selected exporters, for series that are not per GPU."""
    return selectors().for_exporter(metric, INSTANCE_VARIABLE, *matchers)


def query(expr: promql.Expr, legend: str) -> Query:
    """A panel's target: ``expr`` with ``$__rate_interval`` for its ranges."""
    return Query(expr.render(RATE), legend)


def on_models_gpu(gpu_expr: promql.Expr) -> promql.Expr:
    """``gpu_expr`` (one series per GPU, by ``uuid`` and ``gpu``) for each selected model on that GPU.

    The join is on the GPU's UUID alone, which both sides carry as NVML spells it (docs/metrics.md,
    "Joining a model to its GPU"): a model's ``device`` is numbered by its own process, and its
    ``instance`` is the serving endpoint, not the exporter. ``group_left`` keeps the model's labels and adds
    the exporter's GPU index; several models on one GPU each get the GPU's value.
    """
    on_a_gpu = serving(names.LLM_MODEL_INFO, Matcher("uuid", "", "!="))
    models = promql.aggregate("max", on_a_gpu, (*PER_MODEL, "uuid"))
    return models.times(gpu_expr, promql.Matching(("uuid",), group_left=("gpu",)))


def percentile(metric: str, quantile: float, *matchers: Matcher) -> Query:
    """The ``quantile`` of histogram ``metric`` per model (its series narrowed by ``matchers``), from bucket
    rates summed per model."""
    expr = promql.histogram_quantile(quantile, serving(metric, *matchers), PER_MODEL)
    return query(expr, f"p{quantile * 100:g} {MODEL_LEGEND}")


def mean(metric: str, by: tuple[str, ...] = (), what: str = "mean") -> Query:
    """The mean of histogram ``metric`` per model (and ``by``): summed rate of the sum over summed rate of
    the count; its legend starts with ``what``."""
    expr = promql.histogram_mean(serving(metric), (*PER_MODEL, *by))
    legend = " ".join([what, MODEL_LEGEND, *(f"{{{{{label}}}}}" for label in by)])
    return query(expr, legend)


def per_model_rate(metric: str, *matchers: Matcher, by: tuple[str, ...] = ()) -> promql.Expr:
    """The rate of counter ``metric`` per model (and ``by``)."""
    return promql.sum_rate(serving(metric, *matchers), (*PER_MODEL, *by))


def per_model(op: str, metric: str, *matchers: Matcher) -> promql.Expr:
    """Gauge ``metric`` aggregated with ``op`` per model."""
    return promql.aggregate(op, serving(metric, *matchers), PER_MODEL)
