"""The shipped rule files load in vmalert unchanged (docs/deploy.md, "Past one Prometheus"): vmalert's
own check (``-dryRun``) parses every expression with its MetricsQL parser and every annotation and label
template with its template functions. tests/integration/test_fleet_victoriametrics.py then evaluates them
against VictoriaMetrics."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploy import render
from tests.support.services import run_tool

pytestmark = pytest.mark.integration

BROKEN_EXPRESSION = """\
groups:
- name: g
  rules:
  - alert: A
    expr: rate(up[5m]
"""
BROKEN_TEMPLATE = """\
groups:
- name: g
  rules:
  - alert: A
    expr: up == 0
    annotations:
      summary: '{{ $value | noSuchFunction }}'
"""


def vmalert_dry_run(*rule_files: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_tool(["vmalert", "-dryRun", *(f"-rule={path}" for path in rule_files)], cwd=cwd, timeout=60)


def test_the_shipped_rule_files_load_in_vmalert_unchanged(tmp_path: Path) -> None:
    files = render.rule_files()
    assert files
    result = vmalert_dry_run(*files, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in files:
        # vmalert replaces %{NAME} with the environment variable NAME in a rule file before parsing it
        # (Prometheus does not): a file that contained one would mean something else there.
        assert "%{" not in path.read_text(encoding="utf-8"), path


@pytest.mark.parametrize(
    ("text", "message"),
    [(BROKEN_EXPRESSION, "invalid expression"), (BROKEN_TEMPLATE, 'function "noSuchFunction" not defined')],
)
def test_the_dry_run_refuses_what_vmalert_could_not_run(tmp_path: Path, text: str, message: str) -> None:
    """The check can fail: a bad expression or template stops it."""
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    result = vmalert_dry_run(path, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
