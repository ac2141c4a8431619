"""promtool on the rules: the rendered and exported files load, every unit test passes, and the unit tests
fail when a threshold, a ``for:`` or a selector moves. Needs promtool (Debian package prometheus, which
``make test`` installs); the checks that need only Python are tests/unit/alerts/test_rules.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from inferwatch.cli import main as inferwatch_main
from tests.support import PACKAGE_ROOT
from tests.support.services import run_tool

pytestmark = pytest.mark.integration

ALERTS_DIR = PACKAGE_ROOT / "alerts"
RULES = ALERTS_DIR / "rules.yaml"
TEST_FILES = sorted((ALERTS_DIR / "tests").glob("*.yaml"))


def _promtool_run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_tool(["promtool", *args])


def test_promtool_check_rules() -> None:
    result = _promtool_run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = _promtool_run("test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("overrides", "test_file", "failing_test"),
    [
        ({"alerts": {"InferwatchHostBound": {"busy_ratio_below": 0.7}}}, "serving.yaml", "60% busy"),
        ({"alerts": {"InferwatchGpuClocksThrottled": {"for": "5m"}}}, "throttling.yaml", "9-minute cap"),
        ({"selectors": {"exporter": 'job="node"'}}, "throttling.yaml", "hardware slowdown fires"),
        ({"alerts": {"InferwatchKvCacheNearlyFull": {"used_ratio_above": 0.95}}}, "memory.yaml", "95% full"),
        ({"alerts": {"InferwatchKvCachePreemptions": {"for": "5m"}}}, "memory.yaml", "preempts a request"),
    ],
)
def test_promtool_cases_catch_a_changed_rule(
    tmp_path: Path, overrides: dict[str, Any], test_file: str, failing_test: str
) -> None:
    """The unit tests are sharp: a threshold, a `for:` or a selector that moves makes them fail."""
    (tmp_path / "rules.yaml").write_text(rules_yaml(merge_config(overrides)))
    (tmp_path / "tests").mkdir()
    shutil.copy(ALERTS_DIR / "tests" / test_file, tmp_path / "tests")
    result = _promtool_run("test", "rules", str(tmp_path / "tests" / test_file))
    assert result.returncode != 0
    assert failing_test in result.stderr


def test_export_writes_files_promtool_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inferwatch_main(["alerts", "export", str(tmp_path)]) == 0
    assert (tmp_path / "rules.yaml").read_text() == RULES.read_text()
    assert (tmp_path / "config.yaml").read_text() == (ALERTS_DIR / "config.yaml").read_text()
    exported_tests = sorted(path.name for path in (tmp_path / "tests").glob("*.yaml"))
    assert exported_tests == [path.name for path in TEST_FILES]
    # The exported tests find ../rules.yaml: one file shows it (the bundled ones all ran above).
    result = _promtool_run("test", "rules", str(tmp_path / "tests" / "serving.yaml"))
    assert result.returncode == 0, result.stdout
    assert str(tmp_path / "rules.yaml") in capsys.readouterr().out


def test_a_merged_config_renders_rules_promtool_accepts(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("alerts:\n  InferwatchEngineStalled:\n    stall_seconds_above: 30\n")
    assert inferwatch_main(["alerts", "render", "--config", str(mine), "--out", str(tmp_path / "out")]) == 0
    result = _promtool_run("check", "rules", str(tmp_path / "out" / "rules.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
