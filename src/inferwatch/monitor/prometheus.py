"""A small client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``)."""

from __future__ import annotations

import json
import math
from typing import Any

from inferwatch.monitor.http import FetchError, fetch
from inferwatch.monitor.scrape import Labels, labels_of

DEFAULT_TIMEOUT_SECONDS = 10.0

# Group labels -> (unix time, value) points in time order; NaN points are dropped.
RangeResult = dict[Labels, list[tuple[float, float]]]


class PrometheusError(Exception):
    """The server could not be reached, or did not answer like a Prometheus server."""


class QueryError(PrometheusError):
    """Prometheus refused a query; the message is its own explanation."""


class PrometheusClient:
    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            response = fetch(f"{self.url}/api/v1/{path}", self.timeout, params=params)
        except FetchError as exc:
            raise PrometheusError(f"Prometheus at {self.url} is not reachable: {exc}") from None
        try:
            answer = json.loads(response.body)
        except ValueError:
            raise PrometheusError(
                f"{self.url} is not a Prometheus server: /api/v1/{path} answered HTTP "
                f"{response.status} without JSON"
            ) from None
        if answer.get("status") != "success":
            raise QueryError(f"{answer.get('errorType', 'error')}: {answer.get('error', answer)}")
        return answer["data"]

    def version(self) -> str:
        """The server's version; also the check that it is reachable and is a Prometheus."""
        return str(self._api("status/buildinfo").get("version", "unknown"))

    def query(self, expr: str, at: float | None = None) -> dict[Labels, float]:
        """An instant query: the value of each resulting series (NaN values dropped)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._api("query", params)
        if data["resultType"] == "scalar":
            value = float(data["result"][1])
            return {} if math.isnan(value) else {(): value}
        out = {}
        for series in data["result"]:
            value = float(series["value"][1])
            if not math.isnan(value):
                out[labels_of(series["metric"])] = value
        return out

    def query_range(self, expr: str, start: float, end: float, step: float) -> RangeResult:
        """A range query: the points of each resulting series from ``start`` to ``end`` (unix seconds)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._api("query_range", params)
        out: RangeResult = {}
        for series in data["result"]:
            points = [(float(t), float(v)) for t, v in series["values"] if not math.isnan(float(v))]
            if points:
                out[labels_of(series["metric"])] = points
        return out
