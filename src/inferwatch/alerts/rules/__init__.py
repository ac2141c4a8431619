"""inferwatch's Prometheus rules, written once as code and filled in from the configuration.

One module per rule group, matching the promtool tests in ``alerts/tests/``: :mod:`.throttling`,
:mod:`.latency`, :mod:`.memory`, :mod:`.faults`, :mod:`.serving` and :mod:`.monitor` hold the alerts,
:mod:`.recording` the recording rules they read, :mod:`.base` what they are built from.
:func:`render_rules` turns a validated configuration into the ``groups:`` document Prometheus loads.

Conventions (the monitoring-mixin ones): names are CamelCase with the ``Inferwatch`` prefix, every alert
has ``for:``, a ``severity`` of critical/warning/info and ``summary``/``description``/``runbook_url``
annotations, predictions are ANDed with a check of the current state, and counters are read through
``increase``/``rate`` (never their raw value, which includes events from long ago).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import faults, latency, memory, monitor, serving, throttling
from .base import AlertBuilder, AlertGroup, Params
from .recording import GROUP_RECORDING, SLO_HISTOGRAMS, recording_rules

__all__ = ["ALERTS", "GROUPS", "SLO_HISTOGRAMS", "render_rules"]

# The alert groups in the order they are rendered, after the recording rules.
GROUPS: tuple[AlertGroup, ...] = (
    throttling.GROUP,
    latency.GROUP,
    memory.GROUP,
    faults.GROUP,
    serving.GROUP,
    monitor.GROUP,
)


def _by_name(groups: tuple[AlertGroup, ...]) -> dict[str, tuple[str, AlertBuilder]]:
    alerts: dict[str, tuple[str, AlertBuilder]] = {}
    for group in groups:
        for name, builder in group.alerts.items():
            if name in alerts:
                raise ValueError(f"alert {name} is defined twice")
            alerts[name] = (group.name, builder)
    return alerts


# Alert name -> (rule group, builder), in the order they are rendered.
ALERTS = _by_name(GROUPS)


def render_rules(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rule file for ``config`` (already validated): recording rules, then one group per topic."""
    groups = [{"name": GROUP_RECORDING, "rules": recording_rules(config)}]
    for group in GROUPS:
        rules = [
            rule.to_yaml()
            for name, builder in group.alerts.items()
            if config["alerts"][name]["enabled"]
            for rule in builder(Params(name, config))
        ]
        groups.append({"name": group.name, "rules": rules})
    return {"groups": [group for group in groups if group["rules"]]}
