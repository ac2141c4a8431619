"""inferwatch's per-request observations as they are made, for comparison with a ground truth.

A histogram only keeps buckets and a sum; comparing each request's TTFT with what the API or a
synchronized timer measured for it needs the values themselves. :class:`ObservationRecorder` wraps the
``observe`` of the chosen histograms of one model's series (the observations still reach the histograms).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.metrics.model_series import series_for


class ObservationRecorder:
    """``values[name]``: every value observed by the series attribute ``name`` (``"ttft"``, ``"itl"``...)
    of model ``model_name`` on ``registry``, in order."""

    def __init__(self, registry: CollectorRegistry, handle: Any, model_name: str, names: tuple[str, ...]):
        series = series_for(metrics_for(registry, handle.config), model_name)
        self.values: dict[str, list[float]] = {name: [] for name in names}
        for name, values in self.values.items():
            histogram = getattr(series, name)
            observe = histogram.observe

            def record(value: float, observe: Any = observe, values: list[float] = values) -> None:
                values.append(value)
                observe(value)

            histogram.observe = record
