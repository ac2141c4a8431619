"""The unit tier needs only Python: a test that runs an outside tool (promtool, vmalert, amtool, docker
compose, kubectl, hadolint, yamllint) belongs to the integration tier, where a missing tool fails with the
command that installs it (docs/development.md, "Tests")."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent
# How the suite finds or runs an outside tool: tests.support.services.require_binary and run_tool, or
# shutil.which directly.
TOOL_LOOKUPS = {"require_binary", "run_tool", "which"}


def _tool_lookups(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in TOOL_LOOKUPS:
                found.add(name)
    return found


def test_no_unit_test_looks_up_an_outside_tool() -> None:
    offenders = {
        str(path.relative_to(UNIT)): sorted(names)
        for path in sorted(UNIT.rglob("*.py"))
        if (names := _tool_lookups(path))
    }
    assert offenders == {}, f"unit tests that run outside tools (move them to tests/integration): {offenders}"
