"""The generated Kubernetes objects carry alerts/ and dashboards/ exactly, and are up to date."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploy import render
from tests.integration.deploy.support import load_documents
from tests.support.services import run_tool

pytestmark = pytest.mark.integration

SAMPLE_RULES = """\
# A comment above the groups stays a comment.
groups:
  - name: sample
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: SampleDown
        # A comment inside a rule, and a block scalar with an empty line in it.
        expr: |
          job:up:sum

            == 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "{{ $labels.job }} is down: {{ $value }} targets up"
"""


def spec_texts(generated: str) -> list[str]:
    """The text under ``spec:`` of every document of a generated PrometheusRule file, de-indented: the
    inverse of what the generator does, written independently of it."""
    documents: list[list[str]] = [[]]
    for line in generated.splitlines(keepends=True):
        if line == render.DOCUMENT_SEPARATOR:
            documents.append([])
        else:
            documents[-1].append(line)
    texts = []
    for lines in documents:
        if "spec:\n" not in lines:
            continue
        body = lines[lines.index("spec:\n") + 1 :]
        texts.append("".join(line.removeprefix("  ") for line in body))
    return texts


def with_final_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


# ---------------------------------------------------------------------------------- the committed files


def test_the_generator_command_finds_the_committed_files_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(render.REPO_ROOT / "deploy" / "render.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_product_ships_rules_and_dashboards_to_wrap() -> None:
    assert render.rule_files(), "no Prometheus rule file found under alerts/"
    assert render.dashboard_files(), "no dashboard JSON found under dashboards/"


def test_prometheus_rules_hold_the_rule_files_byte_for_byte() -> None:
    generated = render.PROMETHEUS_RULES_FILE.read_text(encoding="utf-8")
    sources = [with_final_newline(p.read_text(encoding="utf-8")) for p in render.rule_files()]
    assert sorted(spec_texts(generated)) == sorted(sources)
    for document in load_documents(generated):
        assert (document["apiVersion"], document["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")


def test_rules_extracted_from_the_prometheus_rules_pass_promtool(tmp_path: Path) -> None:
    generated = render.PROMETHEUS_RULES_FILE.read_text(encoding="utf-8")
    paths = []
    for index, text in enumerate(spec_texts(generated)):
        paths.append(tmp_path / f"extracted-{index}.yaml")
        paths[-1].write_text(text, encoding="utf-8")
    expected_rules = sum(
        len(group["rules"])
        for path in render.rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    )
    result = run_tool(["promtool", "check", "rules", *map(str, paths)])
    assert result.returncode == 0, result.stdout + result.stderr
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout + result.stderr))
    assert found == expected_rules > 0


def test_dashboard_config_maps_hold_the_committed_json_exactly() -> None:
    config_maps = load_documents(render.DASHBOARDS_FILE.read_text(encoding="utf-8"))
    held = {}
    for config_map in config_maps:
        assert config_map["kind"] == "ConfigMap"
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(config_map["data"]) == 1, "one dashboard per ConfigMap keeps each under the size limits"
        held.update(config_map["data"])
    assert held == {p.name: p.read_text(encoding="utf-8") for p in render.dashboard_files()}
    for text in held.values():
        json.loads(text)


# --------------------------------------------------------------------------------------- the generator


@pytest.fixture
def alerts_dir(tmp_path: Path) -> Path:
    """An alerts/ folder laid out like the product's: rules, their configuration, promtool tests."""
    alerts = tmp_path / "alerts"
    (alerts / "tests").mkdir(parents=True)
    (alerts / "rules.yaml").write_text(SAMPLE_RULES, encoding="utf-8")
    (alerts / "config.yaml").write_text('selectors:\n  serving: job="x"\n', encoding="utf-8")
    (alerts / "tests" / "rules_test.yaml").write_text("rule_files: [../rules.yaml]\ntests: []\n")
    return alerts


def test_rule_files_are_recognised_by_content(alerts_dir: Path) -> None:
    assert render.rule_files(alerts_dir) == [alerts_dir / "rules.yaml"]


def test_wrapped_rules_read_back_and_keep_comments_and_block_scalars(alerts_dir: Path) -> None:
    generated = render.render_prometheus_rules(alerts_dir)
    (document,) = load_documents(generated)
    assert document["spec"] == yaml.safe_load(SAMPLE_RULES)
    assert document["metadata"]["name"] == "inferwatch-rules"
    assert spec_texts(generated) == [SAMPLE_RULES]


def test_a_rule_file_without_a_final_newline_is_wrapped_with_one(alerts_dir: Path) -> None:
    (alerts_dir / "rules.yaml").write_text(SAMPLE_RULES.rstrip("\n"), encoding="utf-8")
    assert spec_texts(render.render_prometheus_rules(alerts_dir)) == [SAMPLE_RULES]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("---\n" + SAMPLE_RULES, "document marker"),
        (SAMPLE_RULES + "namespace: x\n", "only `groups`"),
    ],
)
def test_rule_files_that_cannot_be_wrapped_faithfully_are_refused(
    alerts_dir: Path, text: str, message: str
) -> None:
    (alerts_dir / "rules.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(render.RenderError, match=message):
        render.render_prometheus_rules(alerts_dir)


def test_two_sources_that_would_become_one_object_are_refused(alerts_dir: Path) -> None:
    (alerts_dir / "more").mkdir()
    (alerts_dir / "more" / "rules.yml").write_text(SAMPLE_RULES, encoding="utf-8")
    with pytest.raises(render.RenderError, match="both become object 'inferwatch-rules'"):
        render.render_prometheus_rules(alerts_dir)


@pytest.mark.parametrize(
    "text",
    [
        '{\n  "title": "GPU °C"\n}\n',
        '{"title": "no final newline"}',
        '{\n  "title": "trailing spaces"   \n}\n\n',
    ],
)
def test_dashboard_config_maps_keep_any_json_text_exactly(tmp_path: Path, text: str) -> None:
    (tmp_path / "gpu-hardware.json").write_text(text, encoding="utf-8")
    (config_map,) = load_documents(render.render_dashboard_config_maps(tmp_path))
    assert config_map["metadata"]["name"] == "inferwatch-dashboard-gpu-hardware"
    assert config_map["data"] == {"gpu-hardware.json": text}


def test_stale_files_names_what_differs_or_is_missing(tmp_path: Path) -> None:
    current, changed, missing = tmp_path / "current", tmp_path / "changed", tmp_path / "missing"
    current.write_text("same", encoding="utf-8")
    changed.write_text("old", encoding="utf-8")
    stale = render.stale_files({current: "same", changed: "new", missing: "new"})
    assert stale == [changed, missing]
