"""How every panel queries: the label matchers of the dashboard variables, percentiles, means, sums, and
the alert defaults that set the thresholds.

Query conventions (the ones the anchors' dashboards get wrong):

* percentiles are ``histogram_quantile`` over ``sum by (model, le) (rate(X_bucket[$__rate_interval]))``:
  buckets are summed across instances before the quantile, never quantiles averaged or added;
* means are ``sum(rate(X_sum)) / sum(rate(X_count))``, never an average of per-instance averages;
* every range selector uses ``$__rate_interval``; counters are only read through ``rate``/``increase``.

Thresholds that correspond to an alert come from the alert's default configuration (alerts/config.yaml),
so a panel turns red where the alert would fire.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from inferwatch.alerts.config import default_config
from inferwatch.common import names

from ..grafana import RATE, Query

# Label matchers every serving-side / per-GPU / per-instance selector carries.
SERVING = 'model=~"$model", instance=~"$instance"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
# The GPU side of a join onto each model's GPU (on_models_gpu): found by UUID, on whichever exporter.
MODELS_GPU = 'gpu=~"$gpu"'
INSTANCE = 'instance=~"$instance"'

QUANTILES = (0.5, 0.9, 0.99)


@cache
def alert_settings(name: str) -> dict[str, Any]:
    """The default settings of alert ``name`` (alerts/config.yaml)."""
    return default_config()["alerts"][name]


def sel(metric: str, matchers: str, extra: str = "") -> str:
    """``metric{matchers, extra}``."""
    return f"{metric}{{{matchers}{', ' + extra if extra else ''}}}"


def on_models_gpu(gpu_expr: str) -> str:
    """``gpu_expr`` (one series per GPU, by ``uuid`` and ``gpu``) for each selected model on that GPU.

    The join is on the GPU's UUID alone, which both sides carry as NVML spells it (docs/metrics.md,
    "Joining a model to its GPU"): a model's ``device`` is numbered by its own process, and its
    ``instance`` is the serving endpoint, not the exporter. ``group_left`` keeps the model's labels and adds
    the exporter's GPU index; several models on one GPU each get the GPU's value.
    """
    on_a_gpu = sel(names.LLM_MODEL_INFO, SERVING, 'uuid!=""')
    models = f"max by (model, uuid) ({on_a_gpu})"
    return f"{models}\n  * on (uuid) group_left (gpu)\n{gpu_expr}"


def summed(function: str, metric: str, matchers: str, by: str) -> str:
    """``sum by (by) (function(metric{matchers}[$__rate_interval]))`` for rate or increase."""
    return f"sum by ({by}) ({function}({sel(metric, matchers)}[{RATE}]))"


def percentile(metric: str, quantile: float, by: str = "model") -> Query:
    """The ``quantile`` of histogram ``metric`` per ``by``, from buckets summed over instances."""
    expr = f"histogram_quantile({quantile}, {summed('rate', metric + '_bucket', SERVING, by + ', le')})"
    return Query(expr, f"p{quantile * 100:g} {{{{{by}}}}}")


def mean(metric: str, by: str = "model", matchers: str = SERVING) -> Query:
    """The mean of histogram ``metric`` per ``by``: summed rate of the sum over summed rate of the count."""
    expr = (
        f"{summed('rate', metric + '_sum', matchers, by)} / {summed('rate', metric + '_count', matchers, by)}"
    )
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return Query(expr, f"mean {legend}")
