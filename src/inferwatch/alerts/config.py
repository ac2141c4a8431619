"""The rules' configuration: bundled defaults (config.yaml) with a user's overrides merged over them.

The defaults file is also the schema: a user's key must exist in it and its value must have the default's
type. A few naming conventions add range checks, so a new threshold gets the right check by being named
well: numbers are never negative, a key containing ``ratio`` is a fraction in [0, 1], ``for`` and keys
ending in ``window`` or ``lookback`` are Prometheus durations, ``severity`` is one of three levels. Every
alert also accepts ``enabled`` (default true).

Errors name the offending key by its dotted path (``alerts.InferwatchHostBound.busy_ratio_below``), so a
user can find it in their file.
"""

from __future__ import annotations

import copy
import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferwatch.common.durations import parse_duration
from inferwatch.common.promql import Matcher, Selector, parse_matchers

SEVERITIES = ("critical", "warning", "info")


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


def default_config_text() -> str:
    """The bundled defaults (alerts/config.yaml), read through importlib.resources."""
    return importlib.resources.files(__package__).joinpath("config.yaml").read_text(encoding="utf-8")


def default_config() -> dict[str, Any]:
    """The bundled defaults as a mapping."""
    import yaml  # the alerts extra: importing this module for ConfigError needs none

    return yaml.safe_load(default_config_text())


def load_config(path: Path | None = None) -> dict[str, Any]:
    """The defaults with the YAML file at ``path`` (if any) merged over them, validated."""
    import yaml

    overrides: object = {}
    if path is not None:
        try:
            overrides = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    return merge_config(overrides)


def merge_config(overrides: object) -> dict[str, Any]:
    """The defaults with ``overrides`` merged over them; raises ConfigError naming the first bad key."""
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"the configuration must be a mapping, got {type(overrides).__name__}")
    defaults = default_config()
    for alert in defaults["alerts"].values():
        alert.setdefault("enabled", True)
    merged = _merge(defaults, overrides, "")
    _check_values(merged, "")
    return merged


def _merge(defaults: dict[str, Any], overrides: Mapping[str, Any], path: str) -> dict[str, Any]:
    merged = copy.deepcopy(defaults)
    for key, value in overrides.items():
        where = f"{path}{key}"
        if key not in defaults:
            known = ", ".join(sorted(map(str, defaults)))
            raise ConfigError(f"unknown key {where!r} (known keys here: {known})")
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where!r} must be a mapping, got {value!r}")
            merged[key] = _merge(default, value, f"{where}.")
        else:
            _check_type(where, default, value)
            merged[key] = value
    return merged


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _check_type(where: str, default: object, value: Any) -> None:
    if _type_name(value) != _type_name(default):
        raise ConfigError(f"{where!r} must be a {_type_name(default)}, got {value!r}")
    if isinstance(default, list) and default:
        element = default[0]
        for item in value:
            if _type_name(item) != _type_name(element):
                raise ConfigError(f"{where!r} must be a list of {_type_name(element)}s, got {item!r}")


def _check_values(node: Mapping[str, Any], path: str) -> None:
    """Range checks by naming convention, over the merged tree."""
    for key, value in node.items():
        where = f"{path}{key}"
        if isinstance(value, Mapping):
            _check_values(value, f"{where}.")
            continue
        for item in value if isinstance(value, list) else [value]:
            _check_scalar(where, key, item)
        if path == "selectors.":
            try:
                parse_matchers(value)
            except ValueError:
                raise ConfigError(
                    f'{where!r} must be PromQL label matchers like job="llm", got {value!r}'
                ) from None


def _check_scalar(where: str, key: str, value: object) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{where!r} must not be negative, got {value!r}")
        if "ratio" in key and value > 1:
            raise ConfigError(f"{where!r} is a ratio and must be between 0 and 1, got {value!r}")
    if key == "severity" and value not in SEVERITIES:
        raise ConfigError(f"{where!r} must be one of {', '.join(SEVERITIES)}, got {value!r}")
    if key == "for" or key.endswith(("window", "lookback")):
        try:
            parse_duration(value, promql=True)
        except ValueError:
            raise ConfigError(
                f"{where!r} must be a Prometheus duration such as 5m or 1h, got {value!r}"
            ) from None


@dataclass(frozen=True)
class Selectors:
    """The configured matchers of each job (``selectors`` of the configuration), which every selector of a
    rule or a dashboard panel starts with: the mixin's job selectors."""

    serving: tuple[Matcher, ...]
    exporter: tuple[Matcher, ...]

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Selectors:
        configured = config["selectors"]
        return cls(parse_matchers(configured["serving"]), parse_matchers(configured["exporter"]))

    def for_serving(self, metric: str, *matchers: Matcher) -> Selector:
        """``metric`` from instrumented serving processes, narrowed by ``matchers``."""
        return Selector(metric, (*self.serving, *matchers))

    def for_exporter(self, metric: str, *matchers: Matcher) -> Selector:
        """``metric`` from inferwatch-exporter, narrowed by ``matchers``."""
        return Selector(metric, (*self.exporter, *matchers))
