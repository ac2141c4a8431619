"""A JSON Schema for dashboard JSON, derived from grafana-foundation-sdk's own model classes.

grafana-foundation-sdk 0.0.21 ships no JSON Schema file, and its ``from_json`` methods accept anything
(unknown keys are dropped silently). The model classes still carry the schema the SDK was generated
from: every class lists its JSON keys (in ``to_json``, which writes some always and the rest when set)
and their types (its annotations). This module turns them into a JSON Schema and checks a dashboard
with ``jsonschema``:

* every object may only have the keys its class knows (``additionalProperties: false``), and must have
  the keys the class always writes;
* every value has its annotated type: strings, integers, numbers, booleans, enums (their exact
  values), lists, maps, nested classes, unions; ``None`` only where the annotation is Optional;
* fields the dashboard schema types as "anything" are checked with the schema of what they hold: a
  panel's ``options`` and ``fieldConfig.defaults.custom`` against its panel plugin's ``Options`` and
  ``FieldConfig`` classes, and its ``targets`` against the Prometheus ``Dataquery`` class.

What this cannot see: constraints the SDK's classes do not encode (value ranges, string patterns,
cross-field rules such as unique panel ids, which :func:`validate_dashboard` checks itself).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import jsonschema
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.models import dashboard, prometheus

# In a generated ``to_json``: ``"type": self.type_val,`` inside the payload literal (always written) or
# ``payload["gridPos"] = self.grid_pos`` under an ``is not None`` check (written when set).
_ALWAYS_WRITTEN = re.compile(r'^\s*"(?P<key>[^"]+)": self\.(?P<attr>\w+),$', re.MULTILINE)
_WRITTEN_WHEN_SET = re.compile(r'^\s*payload\["(?P<key>[^"]+)"\] = self\.(?P<attr>\w+)$', re.MULTILINE)


class _SchemaBuilder:
    """JSON Schema ``$defs`` for SDK model classes, built on demand."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def ref(self, cls: type) -> dict[str, Any]:
        name = f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
        if name not in self.defs:
            self.defs[name] = {}  # placeholder: breaks recursion through self-referencing classes
            self.defs[name] = self._object(cls)
        return {"$ref": f"#/$defs/{name}"}

    def _object(self, cls: type) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        source = inspect.getsource(cls.to_json)
        properties, required = {}, []
        for pattern, always in ((_ALWAYS_WRITTEN, True), (_WRITTEN_WHEN_SET, False)):
            for match in pattern.finditer(source):
                annotation = hints[match["attr"]]
                if always:
                    required.append(match["key"])
                else:
                    # Written only when not None: the key is absent rather than null.
                    annotation = _without_none(annotation)
                properties[match["key"]] = self.type_schema(annotation)
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    def type_schema(self, annotation: Any) -> dict[str, Any]:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin in (typing.Union, types.UnionType):
            if dashboard.RowPanel in args:
                # The SDK decodes a panel by its type, as Grafana does: rows are RowPanel, the rest Panel.
                row = {"properties": {"type": {"const": "row"}}, "required": ["type"]}
                return {"if": row, "then": self.ref(dashboard.RowPanel), "else": self.ref(dashboard.Panel)}
            return {"anyOf": [self.type_schema(arg) for arg in args]}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin is list:
            return {"type": "array", "items": self.type_schema(args[0])}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.type_schema(args[1])}
        if annotation is type(None):
            return {"type": "null"}
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return {"enum": [member.value for member in annotation]}
        if annotation is bool:
            return {"type": "boolean"}
        if annotation is int:
            return {"type": "integer"}
        if annotation is float:
            return {"type": "number"}
        if annotation is str:
            return {"type": "string"}
        if annotation is variants.Dataquery:
            # The dashboard model leaves queries to the data source plugin; ours are all Prometheus.
            return self.ref(prometheus.Dataquery)
        if isinstance(annotation, type) and hasattr(annotation, "from_json"):
            return self.ref(annotation)
        return {}  # `object` / Any: checked separately where inferwatch knows what it holds


def _without_none(annotation: Any) -> Any:
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _schema_for(cls: type) -> dict[str, Any]:
    builder = _SchemaBuilder()
    root = builder.ref(cls)
    return {**root, "$defs": builder.defs}


def dashboard_schema() -> dict[str, Any]:
    """JSON Schema of a dashboard (the SDK's ``dashboard.Dashboard``, schema v1)."""
    return _schema_for(dashboard.Dashboard)


def panel_plugin_schemas(panel_type: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Schemas of a panel plugin's ``options`` and ``fieldConfig.defaults.custom`` (None: the SDK has
    no class for it)."""
    module = importlib.import_module(f"grafana_foundation_sdk.models.{panel_type.replace('-', '')}")
    options = getattr(module, "Options", None)
    field_config = getattr(module, "FieldConfig", None)
    return (
        _schema_for(options) if options is not None else None,
        _schema_for(field_config) if field_config is not None else None,
    )


def _errors(schema: dict[str, Any], instance: Any, where: str) -> Iterator[str]:
    for error in jsonschema.Draft202012Validator(schema).iter_errors(instance):
        # For "not valid under any of the given schemas", the alternative that got furthest into the
        # instance (not, say, the `null` of an Optional) says what is wrong.
        while error.context:
            error = max(error.context, key=lambda e: len(e.absolute_path))
        path = "/".join(str(part) for part in error.absolute_path)
        yield f"{where}/{path}: {error.message}"


def validate_dashboard(data: dict[str, Any]) -> list[str]:
    """Every way ``data`` departs from the SDK's dashboard model, as ``path: message`` lines."""
    problems = list(_errors(dashboard_schema(), data, ""))
    ids = [panel.get("id") for panel in data.get("panels", [])]
    if len(ids) != len(set(ids)):
        problems.append("/panels: panel ids are not unique")
    for index, panel in enumerate(data.get("panels", [])):
        if panel.get("type") == "row":
            continue
        options_schema, custom_schema = panel_plugin_schemas(panel["type"])
        where = f"/panels/{index}"
        if options_schema is not None and "options" in panel:
            problems += _errors(options_schema, panel["options"], f"{where}/options")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom_schema is not None and custom is not None:
            problems += _errors(custom_schema, custom, f"{where}/fieldConfig/defaults/custom")
    return problems
