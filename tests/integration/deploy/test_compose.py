"""The compose stack: validated by a real compose implementation (Debian's docker-compose), its Prometheus
configuration loaded by promtool from a directory laid out like the container's mounts, its Alertmanager
configuration by amtool, and its services wired to each other."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from deploy import render
from tests.integration.deploy.support import (
    COMPOSE_DIR,
    DOCKER_DIR,
    VARIANTS,
    alert_rule_jobs,
    bind_mounts,
    compose_config,
    container_ports,
    project_version,
    run_tool,
)

pytestmark = pytest.mark.integration

# Service -> (image, Dockerfile) of the images built from this repository; every other image is pulled
# and must be pinned to a release.
BUILT_IMAGES = {
    "demo": ("inferwatch-serving", DOCKER_DIR / "Dockerfile.serving"),
    "exporter": ("inferwatch-exporter", DOCKER_DIR / "Dockerfile.exporter"),
}
RELEASE_TAG = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+$")


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def stack(request: pytest.FixtureRequest) -> dict[str, Any]:
    return compose_config(VARIANTS[request.param])


@pytest.fixture(scope="module")
def cpu_stack() -> dict[str, Any]:
    return compose_config(VARIANTS["default"])


def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))


def test_every_port_is_published_on_loopback_only(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_images_are_pinned_and_built_ones_carry_the_project_version(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        if name in BUILT_IMAGES:
            image, dockerfile = BUILT_IMAGES[name]
            assert service["image"] == f"{image}:{project_version()}"
            assert Path(service["build"]["context"]) / service["build"]["dockerfile"] == dockerfile
        else:
            assert RELEASE_TAG.match(service["image"]), (
                f"{name}: {service['image']} is not pinned to a release"
            )


def test_bind_mounts_exist(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name} mounts missing {source} at {target}"


def test_the_gpu_override_reserves_gpus_for_demo_and_exporter() -> None:
    stack = compose_config(VARIANTS["nvidia-override"])
    for name in ("demo", "exporter"):
        (device,) = stack["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_the_exporter_container_is_locked_down(stack: dict[str, Any]) -> None:
    exporter = stack["services"]["exporter"]
    assert exporter["read_only"] is True
    assert exporter["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in exporter["security_opt"]


def test_prometheus_mounts_exactly_the_rule_files_of_alerts(cpu_stack: dict[str, Any]) -> None:
    mounts = bind_mounts(cpu_stack["services"]["prometheus"])
    rule_mounts = {source for target, source in mounts.items() if target.startswith("/etc/prometheus/rules/")}
    assert rule_mounts == set(render.rule_files())


def test_prometheus_config_passes_promtool_with_the_stack_mounts(
    cpu_stack: dict[str, Any], tmp_path: Path
) -> None:
    """The configuration is loaded from a directory laid out like the container's filesystem, so rule
    files resolve through the same mounts Prometheus sees."""
    for target, source in bind_mounts(cpu_stack["services"]["prometheus"]).items():
        (tmp_path / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target.lstrip("/")).symlink_to(source)
    config_path = tmp_path / "etc" / "prometheus" / "prometheus.yml"
    result = run_tool(["promtool", "check", "config", str(config_path)])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    expected_rules = sum(
        len(group["rules"])
        for path in render.rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    )
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", output))
    assert found == expected_rules > 0, output


def test_scrape_targets_are_services_of_the_stack_on_their_ports(cpu_stack: dict[str, Any]) -> None:
    services = cpu_stack["services"]
    config = prometheus_config()
    targets = [
        (job["job_name"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    targets += [
        ("alerting", target)
        for manager in config["alerting"]["alertmanagers"]
        for static in manager["static_configs"]
        for target in static["targets"]
    ]
    for job, target in targets:
        host, port = target.rsplit(":", 1)
        service = "prometheus" if host == "localhost" else host
        assert service in services, f"{job}: {target} is not a service of the stack"
        assert int(port) in container_ports(services[service]), f"{job}: {service} serves no port {port}"


def test_scrape_jobs_are_the_ones_the_alert_rules_select(cpu_stack: dict[str, Any]) -> None:
    jobs = {job["job_name"]: job for job in prometheus_config()["scrape_configs"]}
    selected = alert_rule_jobs()
    assert jobs[selected["exporter"]]["static_configs"][0]["targets"] == ["exporter:8798"]
    assert jobs[selected["serving"]]["static_configs"][0]["targets"] == ["demo:8797"]


def test_alertmanager_config_passes_amtool() -> None:
    result = run_tool(["amtool", "check-config", str(COMPOSE_DIR / "alertmanager" / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_reads_the_stack_prometheus_and_the_dashboards(
    cpu_stack: dict[str, Any],
) -> None:
    grafana = cpu_stack["services"]["grafana"]
    mounts = bind_mounts(grafana)
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    url = urlsplit(datasource["url"])
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert url.hostname in cpu_stack["services"] and url.port in container_ports(
        cpu_stack["services"][url.hostname]
    )
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "inferwatch.yaml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == render.DASHBOARDS_DIR


def _datasource_refs(node: Any) -> list[Any]:
    """Every ``datasource`` value anywhere in a dashboard's JSON."""
    if isinstance(node, dict):
        found = [node["datasource"]] if "datasource" in node else []
        return found + [ref for value in node.values() for ref in _datasource_refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _datasource_refs(value)]
    return []


def test_dashboards_reach_the_provisioned_datasource() -> None:
    """Each dashboard's panels name a Prometheus data source through a variable or the provisioned uid,
    so they load against the stack's Prometheus without editing."""
    provisioned = yaml.safe_load(
        (COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"][0]["uid"]
    for path in render.dashboard_files():
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        variables = {
            v["name"] for v in dashboard.get("templating", {}).get("list", []) if v["type"] == "datasource"
        }
        allowed = {provisioned} | {f"${name}" for name in variables} | {f"${{{name}}}" for name in variables}
        refs = _datasource_refs(dashboard)
        assert refs, f"{path.name} names no data source"
        for ref in refs:
            # Grafana's built-in annotation source and the like are not Prometheus.
            if isinstance(ref, dict) and ref.get("type", "prometheus") != "prometheus":
                continue
            uid = ref.get("uid") if isinstance(ref, dict) else ref
            assert uid in allowed, f"{path.name}: data source {ref} is neither a variable nor {provisioned!r}"
