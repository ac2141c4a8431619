"""Dashboard JSON from the generator code, and the committed copies bundled with the package.

``generate()`` builds every dashboard of :data:`.layouts.DASHBOARDS` and encodes it the one way that is
committed (sorted keys, two-space indent), so a test can regenerate and compare byte for byte.
``bundled_files()`` reads the committed JSON through importlib.resources: it works from a wheel and
needs neither the SDK nor the generator.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Mapping
from typing import Any


def generate(config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """File name -> JSON text of every dashboard, built now from the code, with the selectors and
    thresholds of ``config`` (a validated alerts configuration; default: the bundled one)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from .layouts import DASHBOARDS
    from .panels.queries import configured

    with configured(config):
        return {
            name: json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            for name, build in DASHBOARDS.items()
        }


def bundled_files() -> dict[str, str]:
    """File name -> JSON text of every dashboard shipped in the package."""
    root = importlib.resources.files(__package__)
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".json")
    }
