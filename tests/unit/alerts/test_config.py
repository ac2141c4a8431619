"""The rules' configuration: user values merged over the defaults, and bad input refused by key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferwatch.alerts.config import ConfigError, load_config, merge_config
from inferwatch.alerts.rules import ALERTS, render_rules
from inferwatch.common.durations import parse_duration


def test_defaults_cover_every_alert_and_nothing_else() -> None:
    assert set(merge_config({})["alerts"]) == set(ALERTS)


def test_user_values_are_merged_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "selectors": {"serving": 'job="vllm", namespace="prod"'},
                "alerts": {"InferwatchHostBound": {"busy_ratio_below": 0.3, "for": "2m"}},
            }
        )
    )
    config = load_config(path)
    host_bound = config["alerts"]["InferwatchHostBound"]
    assert host_bound["busy_ratio_below"] == 0.3
    assert host_bound["for"] == "2m"
    # Keys the user did not give keep their defaults, at every level.
    assert host_bound["severity"] == "warning"
    assert config["selectors"]["exporter"] == 'job="inferwatch-exporter"'
    rules = render_rules(config)
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "InferwatchHostBound")
    assert 'llm_gpu_busy_ratio{job="vllm", namespace="prod"} < 0.3' in rule["expr"]
    assert rule["for"] == "2m"


def test_a_disabled_alert_is_left_out() -> None:
    config = merge_config({"alerts": {"InferwatchTimeToFirstTokenBudgetBurn": {"enabled": False}}})
    rules = [r for g in render_rules(config)["groups"] for r in g["rules"]]
    names = {r.get("alert") or r["record"] for r in rules}
    assert "InferwatchTimeToFirstTokenBudgetBurn" not in names
    # ... and so are the recording rules only it needs.
    assert not any("llm_time_to_first_token_seconds:slo_error" in n for n in names)
    assert "InferwatchInterTokenLatencyBudgetBurn" in names


def _alert(name: str, **values: object) -> dict[str, object]:
    return {"alerts": {name: values}}


HOST_BOUND = "InferwatchHostBound"
TTFT_BURN = "InferwatchTimeToFirstTokenBudgetBurn"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (_alert(HOST_BOUND, busy_ratio=0.2), "unknown key 'alerts.InferwatchHostBound.busy_ratio'"),
        (_alert("InferwatchNoSuchAlert"), "unknown key 'alerts.InferwatchNoSuchAlert'"),
        ({"thresholds": {}}, "unknown key 'thresholds'"),
        (
            _alert("InferwatchKvCacheHeadroomLow", headroom_tokens_below=-1),
            "'alerts.InferwatchKvCacheHeadroomLow.headroom_tokens_below' must not be negative",
        ),
        (
            _alert(HOST_BOUND, busy_ratio_below=1.5),
            "'alerts.InferwatchHostBound.busy_ratio_below' is a ratio",
        ),
        (
            _alert(HOST_BOUND, busy_ratio_below="low"),
            "'alerts.InferwatchHostBound.busy_ratio_below' must be a number",
        ),
        (_alert(HOST_BOUND, enabled="no"), "'alerts.InferwatchHostBound.enabled' must be a boolean"),
        (
            _alert(HOST_BOUND, **{"for": "10 minutes"}),
            "'alerts.InferwatchHostBound.for' must be a Prometheus duration",
        ),
        (_alert(HOST_BOUND, severity="page"), "'alerts.InferwatchHostBound.severity' must be one of"),
        (
            _alert("InferwatchGpuXidError", xids=[79, "all"]),
            "'alerts.InferwatchGpuXidError.xids' must be a list of numbers",
        ),
        (
            _alert(TTFT_BURN, fast={"burn_rate": -2}),
            f"'alerts.{TTFT_BURN}.fast.burn_rate' must not be negative",
        ),
        (_alert(TTFT_BURN, fast=14), f"'alerts.{TTFT_BURN}.fast' must be a mapping"),
        ({"selectors": {"serving": "job=llm"}}, "'selectors.serving' must be PromQL label matchers"),
        (["not", "a", "mapping"], "the configuration must be a mapping"),
    ],
)
def test_bad_input_is_refused_naming_the_key(overrides: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        merge_config(overrides)
    assert message in str(caught.value)


def test_unreadable_and_invalid_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("alerts: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


@pytest.mark.parametrize(("duration", "seconds"), [("90s", 90), ("5m", 300), ("1h30m", 5400), ("1d", 86400)])
def test_durations_convert_to_seconds(duration: str, seconds: float) -> None:
    assert parse_duration(duration, promql=True) == seconds
