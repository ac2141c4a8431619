"""Library packages never import the command-line dispatcher: ``inferwatch.cli`` imports them (lazily, by
name), so an import the other way would be a package-level cycle that no static tool sees."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO_ROOT

LIBRARY_PACKAGES = ("alerts", "bench", "common", "dashboards", "exporter", "instrumentation", "monitor")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_module_imports_the_cli() -> None:
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for package in LIBRARY_PACKAGES
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        for name in sorted(_imported_modules(path))
        if name == "inferwatch.cli" or name.startswith("inferwatch.cli.")
    ]
    assert not offenders, offenders


def test_every_library_package_is_checked() -> None:
    packages = {path.parent.name for path in REPO_ROOT.glob("*/__init__.py")} - {"cli", "tests"}
    assert packages == set(LIBRARY_PACKAGES)
