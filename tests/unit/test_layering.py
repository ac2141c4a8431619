"""Library packages never import the command-line dispatcher: ``inferwatch.cli`` imports them (lazily, by
name), so an import the other way would be a package-level cycle that no static tool sees.

The exporter's configuration and its collectors form no cycle either: each collector declares its own
options, and ``exporter/config.py`` gathers them by importing the collectors package when asked (inside a
function), never at its own import, while no collector imports the configuration, even for type hints.

Inside ``instrumentation/`` each part imports only the parts below it (:data:`INSTRUMENTATION_LAYERS`,
docs/architecture.md "Layers"), the request path reaches no process-wide object and imports neither the
profiler's package nor the launcher, and the parts that run without torch never import it."""

from __future__ import annotations

import ast
from pathlib import Path

import inferwatch.instrumentation as instrumentation_api
from tests.support import PACKAGE_ROOT

LIBRARY_PACKAGES = ("alerts", "bench", "common", "dashboards", "exporter", "instrumentation", "monitor")


def _module_name(path: Path) -> str:
    """``exporter/collectors/gpm.py`` -> ``inferwatch.exporter.collectors.gpm`` (each top-level package of
    src/inferwatch is one of its subpackages)."""
    parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
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
        for path in sorted((PACKAGE_ROOT / package).rglob("*.py"))
    }


def test_no_library_module_imports_the_cli() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE_ROOT)} imports {name}"
        for package in LIBRARY_PACKAGES
        for path in sorted((PACKAGE_ROOT / package).rglob("*.py"))
        for name in sorted(_imported_modules(path))
        if name == "inferwatch.cli" or name.startswith("inferwatch.cli.")
    ]
    assert not offenders, offenders


def test_every_library_package_is_checked() -> None:
    packages = {path.parent.name for path in PACKAGE_ROOT.glob("*/__init__.py")} - {"cli", "tests"}
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
    config = PACKAGE_ROOT / "exporter" / "config.py"
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


INSTRUMENTATION = "inferwatch.instrumentation"
#: What each part of instrumentation/ may import of the others: a part's imports, at any level (a lazy
#: import couples as much as a module-level one). The request travels metrics -> timing -> model ->
#: batching; instrumenting and tracking put parts together; launcher and demo are commands on top.
INSTRUMENTATION_LAYERS: dict[str, frozenset[str]] = {
    "config": frozenset(),
    "metrics": frozenset({"config"}),
    "profiling": frozenset({"config"}),
    "device": frozenset({"config", "metrics"}),
    "timing": frozenset({"config", "metrics", "device"}),
    "model": frozenset({"config", "metrics", "device", "timing"}),
    "batching": frozenset({"config", "metrics", "device", "timing", "model"}),
    "edge": frozenset({"config", "metrics", "timing"}),
    "endpoint": frozenset({"config", "metrics", "profiling"}),
    "instrumenting": frozenset({"config", "metrics", "device", "timing", "model", "batching", "profiling"}),
    "tracking": frozenset({"config", "metrics", "device", "timing"}),
    "launcher": frozenset(
        {"config", "metrics", "device", "timing", "model", "batching", "edge", "endpoint", "profiling"}
        | {"instrumenting", "tracking", "api"}
    ),
    "demo": frozenset(
        {"config", "metrics", "device", "timing", "model", "batching", "edge", "endpoint", "profiling"}
        | {"instrumenting", "tracking", "launcher", "api"}
    ),
}
#: The parts a request's hooks run in, on the serving thread.
REQUEST_PATH = ("metrics", "timing", "model", "batching", "edge")
#: Process-wide objects: handed to a model's context by instrumenting.py (and to tracked requests by
#: tracking.py), never reached from the request path.
PROCESS_WIDE = frozenset({"BACKGROUND", "NVML_WORKER", "CAPTURES", "TRACKED_REQUESTS"})
#: Parts that run where torch is not loaded: the endpoint's helper process, the HTTP edge of a server
#: whose model runs elsewhere, the series (scraped from processes without a model).
WITHOUT_TORCH = ("metrics", "edge", "endpoint", "config")


def _instrumentation_parts() -> dict[str, list[Path]]:
    parts: dict[str, list[Path]] = {}
    for path in sorted((PACKAGE_ROOT / "instrumentation").rglob("*.py")):
        relative = path.relative_to(PACKAGE_ROOT / "instrumentation")
        if relative.parts[0] == "__init__.py":
            continue
        parts.setdefault(relative.parts[0].removesuffix(".py"), []).append(path)
    return parts


def _part_of(name: str) -> str | None:
    """The part of instrumentation/ that importing ``name`` reaches; "api" for the package's public names."""
    if not _within(name, INSTRUMENTATION) or name == INSTRUMENTATION:
        return None
    part = name.split(".")[2]
    return "api" if part in instrumentation_api.__all__ else part


def test_every_part_of_the_instrumentation_has_a_layer() -> None:
    assert set(_instrumentation_parts()) == set(INSTRUMENTATION_LAYERS)


def test_each_part_of_the_instrumentation_imports_only_the_parts_below_it() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE_ROOT)} imports {name}"
        for part, paths in _instrumentation_parts().items()
        for path in paths
        for name in sorted(_imported_modules(path))
        if (imported := _part_of(name)) not in (None, part) and imported not in INSTRUMENTATION_LAYERS[part]
    ]
    assert not offenders, offenders


def test_the_request_path_reaches_no_process_wide_object() -> None:
    """A model's hooks get their background lane, NVML worker and capture switch from its context, so
    a flush waits for its own model and the hot path imports no profiler."""
    offenders = []
    for part in REQUEST_PATH:
        for path in _instrumentation_parts()[part]:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
            used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
            used |= {
                alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                for alias in node.names
            }
            offenders += [
                f"{path.relative_to(PACKAGE_ROOT)} uses {name}" for name in sorted(used & PROCESS_WIDE)
            ]
    assert not offenders, offenders


def test_the_parts_that_run_without_torch_never_import_it() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE_ROOT)} imports {name}"
        for part in WITHOUT_TORCH
        for path in _instrumentation_parts()[part]
        for name in sorted(_imported_modules(path))
        if name == "torch" or name.startswith("torch.")
    ]
    assert not offenders, offenders
