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

from ..grafana import RATE, Query

# Label matchers every serving-side / per-GPU / per-instance selector carries.
SERVING = 'model=~"$model", instance=~"$instance"'
GPU = 'instance=~"$instance", gpu=~"$gpu"'
INSTANCE = 'instance=~"$instance"'

QUANTILES = (0.5, 0.9, 0.99)


@cache
def alert_settings(name: str) -> dict[str, Any]:
    """The default settings of alert ``name`` (alerts/config.yaml)."""
    return default_config()["alerts"][name]


def sel(metric: str, matchers: str, extra: str = "") -> str:
    """``metric{matchers, extra}``."""
    return f"{metric}{{{matchers}{', ' + extra if extra else ''}}}"


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
