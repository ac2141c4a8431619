"""Library packages never import the command-line dispatcher: ``inferwatch.cli`` imports them (lazily, by
name), so an import the other way would be a package-level cycle that no static tool sees.

The exporter's configuration and its collectors form no cycle either: each collector declares its own
options, and ``exporter/config.py`` gathers them by importing the collectors package when asked (inside a
function), never at its own import, while no collector imports the configuration, even for type hints."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO_ROOT

LIBRARY_PACKAGES = ("alerts", "bench", "common", "dashboards", "exporter", "instrumentation", "monitor")


def _module_name(path: Path) -> str:
    """``exporter/collectors/gpm.py`` -> ``inferwatch.exporter.collectors.gpm`` (each top-level package of
    the repository is one of ``inferwatch``'s, pyproject's package-dir)."""
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(("inferwatch", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imported_modules(path: Path, *, module_level: bool = False) -> set[str]:
    """The names ``path`` imports, relative imports resolved, each ``from M import x`` as both ``M`` and
    ``M.x``. ``module_level``: only the imports that run (or that type checkers read) at its import, those
    inside ``if TYPE_CHECKING:`` included, not those in a function's body."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path))]
    while pending:
        node = pending.pop()
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        pending.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            if module:
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _library_modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in LIBRARY_PACKAGES
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
    }


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


CONFIG = "inferwatch.exporter.config"
COLLECTORS = "inferwatch.exporter.collectors"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _packages(name: str) -> list[str]:
    """The packages that importing ``name`` imports first: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def test_the_exporter_configuration_does_not_import_the_collectors_at_module_level() -> None:
    config = REPO_ROOT / "exporter" / "config.py"
    offenders = sorted(n for n in _imported_modules(config, module_level=True) if _within(n, COLLECTORS))
    assert not offenders, f"exporter/config.py imports {offenders} at module level; import them when asked"


def test_no_collector_reaches_the_exporter_configuration() -> None:
    """No import of a collector module leads to the configuration, through any module and at any level
    (a function's body, ``if TYPE_CHECKING:``), nor through a package that importing a module imports: the
    configuration imports the collectors, so a way back would be a cycle."""
    modules = _library_modules()

    def imports(name: str) -> set[str]:
        found = {n for n in _imported_modules(modules[name]) if n in modules}
        return found | {package for n in found for package in _packages(n) if package in modules}

    paths = {name: [name] for name in modules if _within(name, COLLECTORS)}
    pending = list(paths)
    while pending:
        name = pending.pop()
        for imported in sorted(imports(name) - set(paths)):
            paths[imported] = [*paths[name], imported]
            pending.append(imported)
    assert CONFIG not in paths, " -> ".join(paths[CONFIG])
