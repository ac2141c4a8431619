"""What every rule module builds on: the rule, one alert's configuration, rule groups, and the expression
shapes several rules share.

A rule group is an :class:`AlertGroup`; each alert in it is a function registered with
:meth:`AlertGroup.alert` that receives its own slice of the configuration (:class:`Params`, which also
builds selectors from the configured job matchers) and returns the rule(s) under its name. The functions
hold the expressions, typed values of :mod:`inferwatch.common.promql`, and the words; config.yaml holds
every number, selector and duration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.common import names, promql
from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import PER_MODEL, PER_TARGET, Selector, eq, num

from ..config import Selectors


def bucket_bound(value: float) -> str:
    """A ``le`` regex matching a bucket bound however the client formatted it: Python clients write
    ``1.0``, Go clients ``1``."""
    forms = dict.fromkeys([repr(float(value)), num(value)])
    return "|".join(form.replace(".", "\\.") for form in forms)


def label(name: str) -> str:
    """An annotation template reference to one of the alert's labels."""
    return "{{ $labels." + name + " }}"


VALUE = "{{ $value | humanize }}"
VALUE_PERCENT = "{{ $value | humanizePercentage }}"
VALUE_BYTES = "{{ $value | humanize1024 }}B"
VALUE_DURATION = "{{ $value | humanizeDuration }}"
GPU = f"GPU {label('gpu')} ({label('uuid')}) on {label('instance')}"
MODEL = f"model {label('model')} on {label('instance')}"


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule as Prometheus loads it."""

    name: str
    expr: str
    severity: str
    for_: str
    summary: str
    description: str
    runbook_url: str
    labels: Mapping[str, str]

    def to_yaml(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": self.runbook_url,
            },
        }


class Params:
    """One alert's configuration values, with the selectors every expression is built from."""

    def __init__(self, name: str, config: Mapping[str, Any]) -> None:
        self.name = name
        self.values: Mapping[str, Any] = config["alerts"][name]
        self.selectors = Selectors.of(config)
        self.serving = self.selectors.for_serving
        self.exporter = self.selectors.for_exporter
        self.runbook_url = f"{config['runbook_url']}#{name.lower()}"

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def gpu_users(self) -> str:
        """The sentence of a GPU alert's description that names whom the fault affects: the instrumented
        models on the alert's GPU and the Kubernetes pods it is allocated to, each found by the GPU's
        ``uuid`` when the alert is evaluated (a template query: the models are not labels of the GPU's
        series, and several can share one GPU)."""

        placeholder = eq("uuid", "UUID")

        def query(selector: Selector, by: tuple[str, ...]) -> str:
            text = promql.aggregate("max", selector, by).render()
            # printf's verbs: a % in a configured selector (a regex) must stay a %.
            escaped = text.replace("%", "%%").replace(placeholder.render(), eq("uuid", "%s").render())
            return f"{{{{ range query (printf `{escaped}` $labels.uuid) }}}}"

        models = query(self.serving(names.LLM_MODEL_INFO, placeholder), ("model", "instance"))
        pods = query(self.exporter(names.GPU_KUBERNETES_POD_INFO, placeholder), ("namespace", "pod"))
        model, pod = (
            "{{ .Labels.model }} on {{ .Labels.instance }}",
            "{{ .Labels.namespace }}/{{ .Labels.pod }}",
        )
        return (
            f"Models on it:{models} {model};{{{{ else }}}} none seen;{{{{ end }}}} "
            f"pods:{pods} {pod};{{{{ else }}}} none known;{{{{ end }}}}"
        )

    def rule(
        self,
        expr: promql.Expr,
        summary: str,
        description: str,
        *,
        values: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AlertRule:
        """The rule, with severity and ``for`` from ``values`` (default: the alert's own)."""
        values = self.values if values is None else values
        return AlertRule(
            name=self.name,
            expr=expr.pretty(),
            severity=values["severity"],
            for_=values["for"],
            summary=summary,
            description=description,
            runbook_url=self.runbook_url,
            labels=labels or {},
        )


AlertBuilder = Callable[[Params], list[AlertRule]]


class AlertGroup:
    """One rule group of the rendered file, and the builders of its alerts in the order they are rendered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alerts: dict[str, AlertBuilder] = {}

    def alert(self, name: str) -> Callable[[AlertBuilder], AlertBuilder]:
        """Register the function that builds alert ``name`` (its settings are ``alerts.<name>``)."""

        def register(builder: AlertBuilder) -> AlertBuilder:
            if name in self.alerts:
                raise ValueError(f"alert {name} is defined twice")
            self.alerts[name] = builder
            return builder

        return register


def events_above(
    counter: Selector,
    started: Selector,
    window: str,
    threshold: float,
    by: tuple[str, ...] | None = None,
) -> promql.Expr:
    """Counter ``counter`` rose by more than ``threshold`` over ``window``, optionally summed ``by``;
    ``started`` is when its scrape target's process started (``process_start_time_seconds``, Unix time).

    For a counter its process keeps from 0 at start (not one read from a driver, which a restart of the
    target leaves as it was). increase() sees only rises between samples, and a series can show up at a
    value no sample saw it reach: created at its first event (an error kind, an NVML call), or back after
    a restart of its target at a count as high as before (no drop, so no reset for increase() to count
    from zero). Such a series counts its whole value, in a second branch: when it did not exist ``window``
    ago, or when its target started within ``window`` (then every event of its value happened inside the
    window), whatever the series did before (docs/alerts.md, "Events across restarts"). Each branch is
    judged on its own: with a threshold above 0, events before and after a restart are not added up.
    """
    since_start = promql.time() - started
    restarted = counter.and_(since_start.lt(parse_duration(window, promql=True)), on=PER_TARGET)
    new: promql.Expr = counter.unless(promql.Offset(counter, window)).or_(restarted)
    increase: promql.Expr = promql.increase(counter, window)
    if by is not None:
        new, increase = promql.aggregate("sum", new, by), promql.aggregate("sum", increase, by)
    return increase.gt(threshold).or_(new.gt(threshold))


def per_model_ratio(numerator: Selector, denominator: Selector, window: str) -> promql.Expr:
    """Per :data:`PER_MODEL` group: rate of ``numerator`` over rate of ``denominator``."""
    return promql.ratio_of_rates(numerator, denominator, PER_MODEL, window)
