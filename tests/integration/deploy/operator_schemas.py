"""JSON schemas for the Prometheus Operator objects inferwatch ships (monitoring.coreos.com/v1).

kubernetes-validate carries the schemas of Kubernetes' own kinds only, and no package reachable offline
ships the operator's CRD OpenAPI schemas as JSON schema (the one PyPI package generated from them,
cloudcoil's pydantic models, ignores unknown fields, which would let a misspelt field through). So these
are written by hand from the operator's API reference (``pkg/apis/monitoring/v1``: ServiceMonitorSpec,
Endpoint, PodMonitorSpec, PodMetricsEndpoint, RelabelConfig, PrometheusRuleSpec, RuleGroup, Rule) and
cover the fields a monitoring setup commonly uses, with the operator's own patterns and enums. Every
object is closed (``additionalProperties: false``): a field the operator does not know fails, like a
typo would be pruned silently by the API server. A field added to the manifests that is missing here
must be added from the API reference, not loosened.
"""

from __future__ import annotations

from typing import Any

# The operator's Duration: what Prometheus's model.ParseDuration accepts.
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}

NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}

_ACTIONS = [
    "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
    "lowercase", "uppercase", "keepequal", "dropequal",
]  # fmt: skip
RELABEL_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "minimum": 0},
        "replacement": {"type": "string"},
        # The operator accepts both spellings of every action.
        "action": {"enum": _ACTIONS + [a[0].upper() + a[1:] for a in _ACTIONS]},
    },
}
RELABEL_CONFIGS = {"type": "array", "items": RELABEL_CONFIG}

# Endpoint (ServiceMonitor) and PodMetricsEndpoint (PodMonitor) share these fields.
_SCRAPE_ENDPOINT_PROPERTIES: dict[str, Any] = {
    "path": {"type": "string"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "params": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "trackTimestampsStaleness": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"},
    "followRedirects": {"type": "boolean"},
    "filterRunning": {"type": "boolean"},
    "relabelings": RELABEL_CONFIGS,
    "metricRelabelings": RELABEL_CONFIGS,
}

_INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def _monitor_spec(endpoints_field: str, port_properties: dict, **extra_properties: dict) -> dict:
    """A ServiceMonitor or PodMonitor spec: the two share everything but their endpoints' field name,
    how an endpoint names its port, and a few labels of their own."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector"],
        "properties": {
            "jobLabel": {"type": "string"},
            **extra_properties,
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "sampleLimit": {"type": "integer", "minimum": 0},
            "targetLimit": {"type": "integer", "minimum": 0},
            endpoints_field: {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {**port_properties, **_SCRAPE_ENDPOINT_PROPERTIES},
                },
            },
        },
    }


SERVICE_MONITOR_SPEC = _monitor_spec(
    "endpoints",
    {"port": {"type": "string"}, "targetPort": _INT_OR_STRING},
    targetLabels={"type": "array", "items": {"type": "string"}},
)

POD_MONITOR_SPEC = _monitor_spec(
    "podMetricsEndpoints",
    {"port": {"type": "string"}, "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535}},
)


RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": _INT_OR_STRING,
        "for": DURATION,
        "keep_firing_for": {**DURATION, "minLength": 1},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

PROMETHEUS_RULE_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "labels": STRING_MAP,
                    "interval": DURATION,
                    "query_offset": DURATION,
                    "limit": {"type": "integer"},
                    "partial_response_strategy": {"type": "string", "pattern": r"^(?i:abort|warn)?$"},
                    "rules": {"type": "array", "items": RULE},
                },
            },
        },
    },
}

_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}


def _object_schema(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _object_schema("ServiceMonitor", SERVICE_MONITOR_SPEC),
    "PodMonitor": _object_schema("PodMonitor", POD_MONITOR_SPEC),
    "PrometheusRule": _object_schema("PrometheusRule", PROMETHEUS_RULE_SPEC),
}
