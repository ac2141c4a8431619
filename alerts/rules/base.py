"""What every rule module builds on: the rule, one alert's configuration, rule groups, PromQL helpers.

A rule group is an :class:`AlertGroup`; each alert in it is a function registered with
:meth:`AlertGroup.alert` that receives its own slice of the configuration (:class:`Params`, which also
builds selectors) and returns the rule(s) under its name. The functions hold the expressions and the
words; config.yaml holds every number, selector and duration.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inferwatch.common import names

# Labels serving-side series are aggregated by: one series per scrape target and model.
SERVING_BY = "job, instance, model"


def promql(text: str) -> str:
    """An expression written as an indented block in the source, as it should read in the YAML."""
    return textwrap.dedent(text).strip()


def num(value: float) -> str:
    """A number as PromQL reads it, without float noise (0.144, not 0.14400000000000002)."""
    return format(value, ".12g")


def one_of(values: list[Any]) -> str:
    """A regex alternation for a ``=~`` matcher."""
    return "|".join(str(v) for v in values)


def bucket_bound(value: float) -> str:
    """A ``le`` regex matching a bucket bound however the client formatted it: Python clients write
    ``1.0``, Go clients ``1``."""
    forms = dict.fromkeys([repr(float(value)), num(value)])
    return "|".join(form.replace(".", "\\\\.") for form in forms)


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
        self.selectors: Mapping[str, str] = config["selectors"]
        self.runbook_url = f"{config['runbook_url']}#{name.lower()}"

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def serving(self, metric: str, *matchers: str) -> str:
        """``metric`` from instrumented serving processes, narrowed by ``matchers``."""
        return selector(metric, self.selectors["serving"], matchers)

    def exporter(self, metric: str, *matchers: str) -> str:
        """``metric`` from inferwatch-exporter, narrowed by ``matchers``."""
        return selector(metric, self.selectors["exporter"], matchers)

    def gpu_users(self) -> str:
        """The sentence of a GPU alert's description that names whom the fault affects: the instrumented
        models on the alert's GPU and the Kubernetes pods it is allocated to, each found by the GPU's
        ``uuid`` when the alert is evaluated (a template query: the models are not labels of the GPU's
        series, and several can share one GPU)."""

        def query(selector: str, by: str) -> str:
            # printf's verbs: a % in a configured selector (a regex) must stay a %.
            escaped = selector.replace("%", "%%").replace('uuid="UUID"', 'uuid="%s"')
            return f"{{{{ range query (printf `max by ({by}) ({escaped})` $labels.uuid) }}}}"

        models = query(self.serving(names.LLM_MODEL_INFO, 'uuid="UUID"'), "model, instance")
        pods = query(self.exporter(names.GPU_KUBERNETES_POD_INFO, 'uuid="UUID"'), "namespace, pod")
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
        expr: str,
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
            expr=expr,
            severity=values["severity"],
            for_=values["for"],
            summary=summary,
            description=description,
            runbook_url=self.runbook_url,
            labels=labels or {},
        )


def selector(metric: str, configured: str, matchers: tuple[str, ...]) -> str:
    """``metric`` narrowed by the ``configured`` matchers of its job and by ``matchers``."""
    parts = [m for m in (configured.strip().rstrip(","), *matchers) if m]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


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


def events_above(counter: str, window: str, threshold: float, by: str | None = None) -> str:
    """Counter ``counter`` rose by more than ``threshold`` over ``window``, optionally summed ``by``.

    A counter whose label set is created at its first event (an XID code, an error kind) appears with
    value 1, a rise that increase() cannot see; so a series that did not exist ``window`` ago counts
    from zero, in a second branch. (When a group has both kinds, each branch is judged on its own.)
    """
    new = f"({counter} unless {counter} offset {window})"
    increase = f"increase({counter}[{window}])"
    if by is not None:
        new, increase = f"sum by ({by}) {new}", f"sum by ({by}) ({increase})"
    return f"{increase} > {num(threshold)}\nor\n{new} > {num(threshold)}"


def ratio_of_rates(numerator: str, denominator: str, window: str) -> str:
    """Per (job, instance, model): rate of ``numerator`` over rate of ``denominator``."""
    return promql(f"""
        sum by ({SERVING_BY}) (rate({numerator}[{window}]))
        /
        sum by ({SERVING_BY}) (rate({denominator}[{window}]))
    """)
