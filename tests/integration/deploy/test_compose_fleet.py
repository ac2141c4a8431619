"""The sharded stack (compose.fleet.yaml): Prometheus agents splitting the same targets by ``hashmod``,
remote-writing to VictoriaMetrics; vmalert on the rules of alerts/ against it, notifying the stack's
Alertmanager; Grafana on VictoriaMetrics. The generic checks (loopback ports, pinned images, bind mounts,
the exporter) run on it with the other variants in test_compose.py; the topology runs for real in
tests/integration/test_fleet_victoriametrics.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from deploy import render
from tests.integration.deploy.support import (
    COMPOSE_DIR,
    VARIANTS,
    alert_rule_jobs,
    bind_mounts,
    compose_config,
    container_ports,
    run_tool,
)
from tests.support.services import hashmod_shard

pytestmark = pytest.mark.integration

AGENT = re.compile(r"^prometheus-agent-(\d+)$")
AGENT_CONFIG = "/etc/prometheus/prometheus.yml"


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return compose_config(VARIANTS["fleet"])


def agents(stack: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Shard index (from the service's name) -> the agent's service."""
    return {int(m[1]): service for name, service in stack["services"].items() if (m := AGENT.match(name))}


def agent_config(service: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(bind_mounts(service)[AGENT_CONFIG].read_text(encoding="utf-8"))


def flags(service: dict[str, Any]) -> dict[str, str]:
    """A VictoriaMetrics component's ``-name=value`` flags (``-name`` alone: ``"true"``)."""
    found = {}
    for arg in service["command"]:
        name, _, value = arg.lstrip("-").partition("=")
        found[name] = value or "true"
    return found


def assert_reaches(stack: dict[str, Any], url: str, service: str) -> None:
    """``url`` names ``service`` of the stack on a port it serves."""
    parts = urlsplit(url)
    assert parts.hostname == service and service in stack["services"], url
    assert parts.port in container_ports(stack["services"][service]), f"{service} serves no port {parts.port}"


def test_there_are_shards_numbered_from_zero(stack: dict[str, Any]) -> None:
    shards = agents(stack)
    assert len(shards) >= 2 and sorted(shards) == list(range(len(shards)))
    for service in shards.values():
        assert "--agent" in service["command"] and f"--config.file={AGENT_CONFIG}" in service["command"]


def test_every_agent_keeps_its_own_hashmod_shard_of_every_job(stack: dict[str, Any]) -> None:
    shards = agents(stack)
    for index, service in shards.items():
        config = agent_config(service)
        assert "rule_files" not in config and "alerting" not in config, "an agent evaluates no rules"
        for job in config["scrape_configs"]:
            assert job["relabel_configs"] == [
                {
                    "source_labels": ["__address__"],
                    "modulus": len(shards),
                    "target_label": "__tmp_hash",
                    "action": "hashmod",
                },
                {"source_labels": ["__tmp_hash"], "regex": str(index), "action": "keep"},
            ], (index, job["job_name"])


def test_the_agents_differ_only_in_their_shard_index(stack: dict[str, Any]) -> None:
    """So every target is in exactly one shard: the same targets, each kept by one index."""
    texts = {
        index: bind_mounts(service)[AGENT_CONFIG].read_text(encoding="utf-8")
        for index, service in agents(stack).items()
    }

    def without_index(index: int) -> str:
        text = texts[index].replace(f'regex: "{index}"', "regex: SHARD")
        return text.replace(f"shard {index} of", "shard SHARD of")

    assert len({without_index(index) for index in texts}) == 1


def test_agent_configs_pass_promtool(stack: dict[str, Any]) -> None:
    for index, service in agents(stack).items():
        result = run_tool(["promtool", "check", "config", str(bind_mounts(service)[AGENT_CONFIG])])
        assert result.returncode == 0, (index, result.stdout + result.stderr)


def scrape_targets(config: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (job["job_name"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]


def test_targets_are_services_of_the_stack_and_every_shard_has_some(stack: dict[str, Any]) -> None:
    shards = agents(stack)
    targets = scrape_targets(agent_config(shards[0]))
    for job, target in targets:
        host, port = target.rsplit(":", 1)
        assert host in stack["services"], f"{job}: {target} is not a service of the stack"
        assert int(port) in container_ports(stack["services"][host]), f"{job}: {host} serves no port {port}"
    # Prometheus's hashmod, computed here: no agent is left idle.
    assert {hashmod_shard(target, len(shards)) for _, target in targets} == set(shards)


def test_the_jobs_are_the_ones_the_alert_rules_select(stack: dict[str, Any]) -> None:
    jobs = dict(scrape_targets(agent_config(agents(stack)[0])))
    selected = alert_rule_jobs()
    assert jobs[selected["exporter"]] == "exporter:8798"
    assert jobs[selected["serving"]] == "demo:8797"


def test_the_agents_remote_write_to_victoriametrics(stack: dict[str, Any]) -> None:
    for index, service in agents(stack).items():
        (remote_write,) = agent_config(service)["remote_write"]
        assert_reaches(stack, remote_write["url"], "victoriametrics")
        assert urlsplit(remote_write["url"]).path == "/api/v1/write", index
        # No external label: series keep their labels whichever shard scrapes the target.
        assert "external_labels" not in agent_config(service).get("global", {}), index


def test_victoriametrics_flags_are_ones_it_accepts(stack: dict[str, Any]) -> None:
    service = stack["services"]["victoriametrics"]
    vm = flags(service)
    assert int(vm["httpListenAddr"].rsplit(":", 1)[1]) in container_ports(service)
    assert any(v.endswith(f":{vm['storageDataPath']}:rw") for v in service["volumes"])
    # The real binary (Debian's, the image's version) parses the command line and exits.
    result = run_tool(["victoria-metrics", *service["command"], "-version"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmalert_reads_and_writes_victoriametrics_and_notifies_the_alertmanager(
    stack: dict[str, Any],
) -> None:
    vmalert = flags(stack["services"]["vmalert"])
    for flag in ("datasource.url", "remoteRead.url", "remoteWrite.url"):
        assert_reaches(stack, vmalert[flag], "victoriametrics")
    assert_reaches(stack, vmalert["notifier.url"], "alertmanager")
    assert vmalert["disableAlertgroupLabel"] == "true", "alerts must carry the labels Prometheus gives them"
    assert int(vmalert["httpListenAddr"].rsplit(":", 1)[1]) in container_ports(stack["services"]["vmalert"])


def test_vmalert_mounts_exactly_the_rule_files_of_alerts(stack: dict[str, Any]) -> None:
    service = stack["services"]["vmalert"]
    mounts = bind_mounts(service)
    rules = [arg.partition("=")[2] for arg in service["command"] if arg.startswith("-rule=")]
    assert rules and all(rule in mounts for rule in rules)
    assert {mounts[rule] for rule in rules} == set(render.rule_files())


def test_vmalert_s_command_passes_its_dry_run_with_the_stack_mounts(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    """The stack's own command line, rule paths laid out like the container's mounts, through the real
    vmalert's dry run: every flag exists and every rule loads."""
    service = stack["services"]["vmalert"]
    for target, source in bind_mounts(service).items():
        (tmp_path / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target.lstrip("/")).symlink_to(source)
    command = [
        f"-rule={tmp_path / arg.removeprefix('-rule=/')}" if arg.startswith("-rule=") else arg
        for arg in service["command"]
    ]
    result = run_tool(["vmalert", *command, "-dryRun"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_has_the_stack_s_configuration(stack: dict[str, Any]) -> None:
    default = compose_config(VARIANTS["default"])["services"]["alertmanager"]
    assert stack["services"]["alertmanager"] == default


def test_grafana_reads_victoriametrics_as_the_dashboards_data_source(stack: dict[str, Any]) -> None:
    mounts = bind_mounts(stack["services"]["grafana"])
    (datasource,) = yaml.safe_load(
        (mounts["/etc/grafana/provisioning/datasources"] / "victoriametrics.yaml").read_text()
    )["datasources"]
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert_reaches(stack, datasource["url"], "victoriametrics")
    # The uid compose.yaml's data source has, which the dashboards may name.
    provisioned = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"][0]
    assert datasource["uid"] == provisioned["uid"]
    dashboards = mounts["/etc/grafana/provisioning/dashboards"]
    (provider,) = yaml.safe_load((dashboards / "inferwatch.yaml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == render.DASHBOARDS_DIR
