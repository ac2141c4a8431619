"""The rendered rules: up to date, a promtool case for every alert, and the conventions (promtool itself runs
them in tests/integration/alerts/test_promtool.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from inferwatch.alerts.rules import ALERTS, SLO_HISTOGRAMS
from inferwatch.cli import main as inferwatch_main
from inferwatch.instrumentation.config import InstrumentConfig
from tests.support import PACKAGE_ROOT, REPO_ROOT, documented_metrics
from tests.support.promql import base_metric, metric_names

ALERTS_DIR = PACKAGE_ROOT / "alerts"
RULES = ALERTS_DIR / "rules.yaml"
TEST_FILES = sorted((ALERTS_DIR / "tests").glob("*.yaml"))
RUNBOOKS = REPO_ROOT / "docs" / "runbooks.md"
# Series Prometheus makes itself, not any exporter.
SYNTHETIC = {"up"}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def test_committed_rules_are_rendered_from_the_defaults() -> None:
    assert RULES.read_text() == rules_yaml(merge_config({})), (
        "src/inferwatch/alerts/rules.yaml is stale: "
        "run `inferwatch alerts render --out src/inferwatch/alerts`"
    )


def _cases() -> tuple[set[str], set[str]]:
    """Alert names with a firing case, and with a case that must stay quiet."""
    firing, quiet = set(), set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    return firing, quiet


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    names = {rule["alert"] for rule in _alert_rules()}
    firing, quiet = _cases()
    assert names - firing == set(), "alerts without a promtool case where they fire"
    assert names - quiet == set(), "alerts without a promtool case where they must not fire"
    assert (firing | quiet) - names == set(), "promtool cases for alerts that do not exist"


def test_firing_cases_state_every_label_and_annotation() -> None:
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                for alert in case.get("exp_alerts") or []:
                    assert "severity" in alert["exp_labels"], (path.name, test["name"])
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}


def test_alerts_follow_the_mixin_conventions() -> None:
    for rule in _alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Inferwatch(?:[A-Z][a-z0-9]*)+", name), name
        assert rule["for"], name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, name
        assert rule["annotations"]["runbook_url"].endswith(f"#{name.lower()}"), name


def test_every_runbook_url_points_at_a_section_of_docs_runbooks() -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    anchors = {rule["annotations"]["runbook_url"].rsplit("#", 1)[1] for rule in _alert_rules()}
    assert anchors - headings == set()


def test_every_metric_the_rules_name_is_documented() -> None:
    documented = set(documented_metrics("Instrumentation")) | set(documented_metrics("Exporter"))
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    named = {base_metric(name, documented) for rule in _rules() for name in metric_names(rule["expr"])}
    assert named - recorded - SYNTHETIC - documented == set(), (
        "named in alerts/rules.yaml, not in docs/metrics.md"
    )


def test_slo_targets_are_bucket_bounds_of_the_default_histograms() -> None:
    """An SLO's error ratio reads the bucket whose bound is the target: a target between bounds would
    select no bucket and the alert could never fire."""
    buckets = {
        "llm_time_to_first_token_seconds": "ttft_buckets",
        "llm_inter_token_latency_seconds": "itl_buckets",
    }
    config = merge_config({})
    for alert, metric in SLO_HISTOGRAMS.items():
        assert config["alerts"][alert]["target_seconds"] in getattr(InstrumentConfig(), buckets[metric]), (
            alert
        )


def test_every_registered_alert_is_rendered() -> None:
    assert {rule["alert"] for rule in _alert_rules()} == set(ALERTS)


def test_render_merges_a_config_file_and_refuses_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("alerts:\n  InferwatchEngineStalled:\n    stall_seconds_above: 30\n")
    assert inferwatch_main(["alerts", "render", "--config", str(mine), "--out", str(tmp_path / "out")]) == 0
    rendered = (tmp_path / "out" / "rules.yaml").read_text()
    assert 'llm_last_step_timestamp_seconds{job="llm-serving"} > 30' in rendered

    mine.write_text("alerts:\n  InferwatchEngineStalled:\n    stall_seconds_above: -5\n")
    assert inferwatch_main(["alerts", "render", "--config", str(mine), "--out", str(tmp_path / "bad")]) == 2
    assert (
        "'alerts.InferwatchEngineStalled.stall_seconds_above' must not be negative" in capsys.readouterr().err
    )
    assert not (tmp_path / "bad").exists()


def _runbook_sections() -> dict[str, str]:
    sections = re.split(r"^## ", RUNBOOKS.read_text(), flags=re.MULTILINE)[1:]
    return {section.split("\n", 1)[0].strip(): section for section in sections}


def test_every_alert_has_a_complete_runbook_section() -> None:
    sections = _runbook_sections()
    for name in ALERTS:
        assert name in sections, name
        for part in ("**Meaning.**", "**Confirm.**", "**Act.**"):
            assert part in sections[name], (name, part)


def test_the_panels_runbooks_cite_exist() -> None:
    titles: dict[str, set[str]] = {}
    for path in (PACKAGE_ROOT / "dashboards").glob("*.json"):
        dashboard = json.loads(path.read_text())
        name = dashboard["title"].removeprefix("inferwatch / ")
        titles[name] = {panel["title"] for panel in dashboard["panels"] if panel["type"] != "row"}
    cited = re.findall(r"\*\*([A-Z][\w ]+?) ›\s+([^*]+?)\*\*", RUNBOOKS.read_text())
    assert len(cited) > 40
    for dashboard, panel in cited:
        assert " ".join(panel.split()) in titles[dashboard], (dashboard, panel)


def test_docs_alerts_lists_every_alert() -> None:
    table = (REPO_ROOT / "docs" / "alerts.md").read_text()
    assert [name for name in ALERTS if f"| `{name}` |" not in table] == []
