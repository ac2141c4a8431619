"""Every YAML file under deploy/ passes yamllint: above all no duplicate keys, which PyYAML, kubectl and
docker-compose all accept silently (the last one wins), and no `yes`/`on` read as booleans."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.deploy.support import DEPLOY
from tests.support import REPO_ROOT
from tests.support.services import run_tool

pytestmark = pytest.mark.integration

# yamllint's defaults, with the repository's line length; the generated files carry other projects'
# text (the rules' PromQL, the dashboards' JSON), so their lines are as long as those are.
YAMLLINT_CONFIG = """\
extends: default
rules:
  line-length:
    max: 110
    ignore: |
      deploy/kubernetes/base/prometheusrules.yaml
      deploy/kubernetes/base/grafana-dashboards.yaml
  document-start: disable
  indentation:
    spaces: consistent
    indent-sequences: whatever
"""


def yamllint(*paths: Path) -> tuple[int, str]:
    result = run_tool(["yamllint", "--strict", "-f", "parsable", "-d", YAMLLINT_CONFIG, *map(str, paths)])
    return result.returncode, result.stdout + result.stderr


def test_deploy_yaml_passes_yamllint() -> None:
    files = sorted(p.relative_to(REPO_ROOT) for p in DEPLOY.rglob("*.y*ml"))
    assert len(files) > 10
    code, output = yamllint(*files)
    assert code == 0, output


def test_yamllint_catches_a_duplicate_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  hostPID: false\n  hostPID: true\n", encoding="utf-8")
    code, output = yamllint(bad)
    assert code != 0 and "key-duplicates" in output
