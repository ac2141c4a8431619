"""The committed dashboards: regenerated identically, valid for the SDK's model, and built by the rules
of the design brief (variables, units, thresholds, how percentiles, means and rates are written)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.cli import main as inferwatch_main
from inferwatch.dashboards.generate import bundled_files, generate
from inferwatch.dashboards.schema import validate_dashboard
from tests.support import PACKAGE_ROOT, documented_metrics
from tests.support.promql import base_metric, metric_names

COMMITTED = {path.name: path.read_text() for path in sorted((PACKAGE_ROOT / "dashboards").glob("*.json"))}
DASHBOARDS = {name: json.loads(text) for name, text in COMMITTED.items()}


def _panels() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, dashboard in DASHBOARDS.items():
        for panel in dashboard["panels"]:
            if panel["type"] != "row":
                yield f"{name}: {panel['title']}", panel


def _exprs() -> Iterator[tuple[str, str]]:
    for where, panel in _panels():
        for target in panel["targets"]:
            yield where, target["expr"]


def test_the_three_dashboards_are_committed() -> None:
    titles = sorted(d["title"] for d in DASHBOARDS.values())
    assert titles == [
        "inferwatch / Diagnosis",
        "inferwatch / GPU hardware",
        "inferwatch / Inference overview",
    ]
    assert len({d["uid"] for d in DASHBOARDS.values()}) == 3


def test_committed_json_is_what_the_generator_builds() -> None:
    assert generate() == COMMITTED, (
        "src/inferwatch/dashboards/*.json are stale: "
        "run `inferwatch dashboards generate --out src/inferwatch/dashboards`"
    )


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_json_is_valid_for_the_sdk_model(name: str) -> None:
    assert validate_dashboard(DASHBOARDS[name]) == []


@pytest.mark.parametrize(
    ("break_it", "expected"),
    [
        (lambda d: d["panels"][1]["fieldConfig"]["defaults"].update(unti="s"), "'unti' was unexpected"),
        (
            lambda d: d["panels"][1]["gridPos"].update(h="8"),
            "/panels/1/gridPos/h: '8' is not of type 'integer'",
        ),
        (
            lambda d: d["panels"][1]["options"]["legend"].update(placement="middle"),
            "/panels/1/options/legend/placement",
        ),
        (lambda d: d["panels"][1]["targets"][0].update(exp="up"), "'exp' was unexpected"),
        (lambda d: d["panels"][1].update(id=d["panels"][2]["id"]), "panel ids are not unique"),
        (lambda d: d.pop("schemaVersion"), "'schemaVersion' is a required property"),
    ],
)
def test_the_validator_catches_mistakes(break_it: Any, expected: str) -> None:
    broken = copy.deepcopy(DASHBOARDS["inferwatch-overview.json"])
    break_it(broken)
    problems = validate_dashboard(broken)
    assert any(expected in problem for problem in problems), problems


def test_every_dashboard_has_the_four_variables() -> None:
    for name, dashboard in DASHBOARDS.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert list(variables) == ["datasource", "instance", "model", "gpu"], name
        assert variables["datasource"]["type"] == "datasource"
        for label in ("instance", "model", "gpu"):
            assert variables[label]["multi"] and variables[label]["includeAll"], (name, label)
            assert variables[label]["allValue"] == ".*"


def test_every_panel_has_a_unit_thresholds_a_description_and_the_datasource_variable() -> None:
    for where, panel in _panels():
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("unit"), where
        assert defaults["thresholds"]["steps"], where
        assert defaults["thresholds"]["steps"][0]["value"] is None, where
        assert panel.get("description"), where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), where


def test_every_panel_filters_by_the_variables_it_can() -> None:
    for where, expr in _exprs():
        # The GPU side of a join onto each model's GPU is found by UUID on whichever exporter has it: the
        # instance variable selects the model's serving endpoint there.
        models, _, models_gpu = expr.partition("on (uuid) group_left")
        for selector in re.findall(r"[a-z_:][a-z0-9_:]*\{[^}]*\}", models):
            if selector.startswith("job_model:"):
                # Recorded per job and model over every replica: no instance to select.
                assert 'model=~"$model"' in selector and "instance" not in selector, (where, selector)
                continue
            assert 'instance=~"$instance"' in selector, (where, selector)
            if selector.startswith("gpu_"):
                assert 'gpu=~"$gpu"' in selector, (where, selector)
        for selector in re.findall(r"[a-z_]+\{[^}]*\}", models_gpu):
            assert 'gpu=~"$gpu"' in selector and "$instance" not in selector, (where, selector)


def test_every_range_is_the_rate_interval() -> None:
    for where, expr in _exprs():
        for window in re.findall(r"\[([^\]]+)\]", expr):
            # A subquery may span a fixed window (the alert's) at the rate interval's resolution.
            assert window == "$__rate_interval" or window.endswith(":$__rate_interval"), (where, window)


def test_percentiles_come_from_summed_bucket_rates() -> None:
    quantiles = 0
    for where, expr in _exprs():
        for match in re.finditer(r"histogram_quantile\(([^,]+), (.*)\)$", expr):
            quantiles += 1
            assert re.fullmatch(
                r"sum by \([a-z, ]*\ble\) \(rate\([a-z0-9_]+_bucket\{[^}]*\}\[\$__rate_interval\]\)\)",
                match[2],
            ), where
    assert quantiles >= 10


def test_means_divide_summed_rates_of_sum_and_count() -> None:
    """Every ``_count`` is the denominator of a mean over the same histogram's ``_sum``, grouped alike
    (never an average of per-series averages)."""
    means = 0
    for where, expr in _exprs():
        for metric in re.findall(r"([a-z0-9_]+)_count\{", expr):
            means += 1
            rate = r"\(rate\(" + metric + r"_{part}\{{[^}}]*\}}\[\$__rate_interval\]\)\)"
            pattern = (
                r"sum by \(([^)]*)\) "
                + rate.format(part="sum")
                + r" / sum by \(\1\) "
                + rate.format(part="count")
            )
            assert re.search(pattern, expr), (where, expr)
    assert means >= 5


def test_clocks_event_reasons_are_shown_as_a_state_timeline() -> None:
    reasons = [
        (where, panel["type"])
        for where, panel in _panels()
        if "gpu_clocks_event_active" in json.dumps(panel["targets"])
    ]
    assert reasons
    assert all(kind == "state-timeline" for _, kind in reasons), reasons


def test_every_metric_the_dashboards_name_is_documented() -> None:
    """Or recorded: a panel may read a recording rule of alerts/rules.yaml, which ships with them."""
    documented = set(documented_metrics("Instrumentation")) | set(documented_metrics("Exporter")) | {"up"}
    rules = yaml.safe_load((PACKAGE_ROOT / "alerts" / "rules.yaml").read_text())
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    named = {base_metric(name, documented) for _, expr in _exprs() for name in metric_names(expr)}
    variables = [
        v["query"] for d in DASHBOARDS.values() for v in d["templating"]["list"] if v["type"] == "query"
    ]
    named |= {name for query in variables for name in re.findall(r"\b(llm_[a-z_]+|gpu_[a-z_]+)", query)}
    assert named - documented - recorded == set(), (
        "named in dashboards/*.json, not in docs/metrics.md nor recorded by alerts/rules.yaml"
    )


def test_every_selector_starts_with_its_jobs_configured_matchers() -> None:
    """The mixin's job selectors: each series is read from the job alerts/config.yaml names for it."""
    selectors = yaml.safe_load((PACKAGE_ROOT / "alerts" / "config.yaml").read_text())["selectors"]
    for where, expr in _exprs():
        for metric, matchers in re.findall(r"([a-z_:][a-z0-9_:]*)\{([^}]*)\}", expr):
            job = "serving" if metric.startswith(("llm_", "instance_model:", "job_model:")) else "exporter"
            if metric != "up":
                assert matchers.startswith(selectors[job]), (where, metric, matchers)


def test_export_writes_the_bundled_dashboards(tmp_path: Path) -> None:
    assert bundled_files() == COMMITTED
    assert inferwatch_main(["dashboards", "export", str(tmp_path)]) == 0
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == COMMITTED


def test_generate_takes_the_alerts_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same file as `alerts render --config`: its job selectors go into every query and its thresholds
    into the panels, so the dashboards read what the rules read."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        'selectors:\n  serving: job="vllm"\nalerts:\n  InferwatchHostBound:\n    busy_ratio_below: 0.3\n'
    )
    out = tmp_path / "out"
    assert inferwatch_main(["dashboards", "generate", "--config", str(mine), "--out", str(out)]) == 0
    overview = json.loads((out / "inferwatch-overview.json").read_text())
    exprs = [target["expr"] for panel in overview["panels"] for target in panel.get("targets", [])]
    assert not [expr for expr in exprs if 'job="llm-serving"' in expr]
    assert any('llm_requests_running{job="vllm", model=~"$model"' in expr for expr in exprs)
    assert any('{job="inferwatch-exporter", ' in expr for expr in exprs)
    busy = next(panel for panel in overview["panels"] if panel["title"] == "Device busy ratio")
    assert busy["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.3
    # The defaults are back for the next build.
    assert generate() == COMMITTED

    mine.write_text("selectors:\n  serving: vllm\n")
    assert inferwatch_main(["dashboards", "generate", "--config", str(mine), "--out", str(out)]) == 2
    assert "'selectors.serving' must be PromQL label matchers" in capsys.readouterr().err
