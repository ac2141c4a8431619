"""The Kubernetes manifests: every kustomization builds with real kustomize (``kubectl kustomize``), every
object is valid against the Kubernetes schemas or the Prometheus Operator's, and the pieces are wired to
each other and to the alert rules' selectors."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.integration.deploy.operator_schemas import SCHEMAS
from tests.integration.deploy.support import (
    KUBERNETES_DIR,
    alert_rule_jobs,
    kustomization_dirs,
    project_version,
)

pytestmark = pytest.mark.integration

# The oldest Kubernetes release the manifests claim (docs/deploy.md) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
BUILDS = [str(d.relative_to(KUBERNETES_DIR)) for d in kustomization_dirs()]
OPERATOR_GROUP = "monitoring.coreos.com"


def objects_of(build: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in build if o["kind"] == kind]


def the(build: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects_of(build, kind) if o["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_builds_cover_base_and_every_overlay() -> None:
    assert "base" in BUILDS
    assert {b for b in BUILDS if b.startswith("overlays/")} == {
        f"overlays/{p.name}" for p in (KUBERNETES_DIR / "overlays").iterdir()
    }


@pytest.mark.parametrize("build_name", BUILDS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_against_its_schema(
    kustomize_builds: dict[str, list[dict[str, Any]]], build_name: str, version: str
) -> None:
    for obj in kustomize_builds[build_name]:
        what = f"{build_name}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith(OPERATOR_GROUP + "/"):
            errors = [
                e.message for e in jsonschema.Draft202012Validator(SCHEMAS[obj["kind"]]).iter_errors(obj)
            ]
            assert not errors, f"{what}: {errors}"
        else:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{what} against Kubernetes {version}: {'.'.join(map(str, exc.path))}: {exc.message}"
                )


def test_the_exporter_runs_locked_down_on_every_gpu_node(kustomize_builds: dict) -> None:
    pod = the(kustomize_builds["base"], "DaemonSet", "inferwatch-exporter")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert not any(pod.get(key) for key in ("hostPID", "hostNetwork", "hostIPC"))
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert not security.get("privileged")
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    resources = container["resources"]
    assert not any("nvidia.com/gpu" in resources[k] for k in resources), "a monitor must not take a GPU"
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def _quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", value).groups()
    return float(number) * units[unit]


def test_exporter_resources_fit_its_benchmark_targets(kustomize_builds: dict) -> None:
    """Requests at the targets (< 1 % of a core, RSS < 60 MB) so scheduling reserves what the exporter
    uses; limits above them so a node with many GPUs is not throttled or killed."""
    (container,) = the(kustomize_builds["base"], "DaemonSet", "inferwatch-exporter")["spec"]["template"][
        "spec"
    ]["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert _quantity(requests["cpu"]) <= 0.01 < _quantity(limits["cpu"])
    assert 60e6 <= _quantity(requests["memory"]) < _quantity(limits["memory"])


@pytest.mark.parametrize("build_name", BUILDS)
def test_host_pid_only_where_per_process_metrics_are_asked_for(
    kustomize_builds: dict, build_name: str
) -> None:
    wants_processes = any(c.endswith("/per-process-metrics") for c in _components(build_name))
    pod = the(kustomize_builds[build_name], "DaemonSet", "inferwatch-exporter")["spec"]["template"]["spec"]
    assert bool(pod.get("hostPID")) is wants_processes


def _components(build_name: str) -> list[str]:
    kustomization = yaml.safe_load((KUBERNETES_DIR / build_name / "kustomization.yaml").read_text())
    return kustomization.get("components", [])


@pytest.mark.parametrize("build_name", BUILDS)
def test_the_pod_resources_socket_is_mounted_read_only_and_root_only_where_attribution_is_asked_for(
    kustomize_builds: dict, build_name: str
) -> None:
    wants_pods = any(c.endswith("/pod-attribution") for c in _components(build_name))
    pod = the(kustomize_builds[build_name], "DaemonSet", "inferwatch-exporter")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    if not wants_pods:
        assert host_paths == {} and pod["securityContext"]["runAsNonRoot"] is True
        return
    assert host_paths == {"pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}
    mount = mounts["pod-resources"]
    assert mount["readOnly"] is True and mount["mountPath"] == "/var/lib/kubelet/pod-resources"
    # Root for the kubelet's root-only socket, and nothing more than that.
    assert pod["securityContext"]["runAsUser"] == 0
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert not security.get("privileged") and not pod.get("hostNetwork")


@pytest.mark.parametrize("build_name", BUILDS)
def test_the_exporter_s_pod_labels_are_honoured_and_its_own_pod_s_dropped(
    kustomize_builds: dict, build_name: str
) -> None:
    (endpoint,) = the(kustomize_builds[build_name], "ServiceMonitor", "inferwatch-exporter")["spec"][
        "endpoints"
    ]
    assert endpoint["honorLabels"] is True
    drops = [r["regex"] for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert [set(d.split("|")) for d in drops] == [{"namespace", "pod", "container"}]


@pytest.mark.parametrize("build_name", BUILDS)
def test_service_monitor_service_and_pods_are_wired_together(kustomize_builds: dict, build_name: str) -> None:
    build = kustomize_builds[build_name]
    daemonset = the(build, "DaemonSet", "inferwatch-exporter")
    service = the(build, "Service", "inferwatch-exporter")
    monitor = the(build, "ServiceMonitor", "inferwatch-exporter")
    template = daemonset["spec"]["template"]
    (container,) = template["spec"]["containers"]
    container_ports = {p["name"] for p in container["ports"]}

    assert selects(daemonset["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
    assert selects(service["spec"]["selector"], template["metadata"]["labels"])
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    assert {
        container["livenessProbe"]["httpGet"]["port"],
        container["readinessProbe"]["httpGet"]["port"],
    } <= (container_ports)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert container["args"] == [f"--web.listen-address=:{container['ports'][0]['containerPort']}"]


@pytest.mark.parametrize("build_name", BUILDS)
def test_scrape_jobs_are_the_ones_the_alert_rules_select(kustomize_builds: dict, build_name: str) -> None:
    build = kustomize_builds[build_name]
    jobs = alert_rule_jobs()
    # A ServiceMonitor without jobLabel names the job after the Service.
    monitor = the(build, "ServiceMonitor", "inferwatch-exporter")
    assert "jobLabel" not in monitor["spec"]
    assert (
        jobs["exporter"]
        == "inferwatch-exporter"
        == the(build, "Service", "inferwatch-exporter")["metadata"]["name"]
    )
    (endpoint,) = the(build, "PodMonitor", "inferwatch-serving")["spec"]["podMetricsEndpoints"]
    job_relabels = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert job_relabels == [{"targetLabel": "job", "replacement": jobs["serving"]}]


def test_kube_prometheus_stack_overlay_labels_every_operator_object(kustomize_builds: dict) -> None:
    build = kustomize_builds["overlays/kube-prometheus-stack"]
    operator_objects = [o for o in build if o["apiVersion"].startswith(OPERATOR_GROUP + "/")]
    assert {o["kind"] for o in operator_objects} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in operator_objects)
    dashboards = [o for o in build if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert dashboards and all(o["metadata"]["namespace"] == "monitoring" for o in dashboards)
    assert not any("release" in o["metadata"].get("labels", {}) for o in kustomize_builds["base"])


def test_the_exporter_image_is_tagged_with_the_project_version(kustomize_builds: dict) -> None:
    for build_name, build in kustomize_builds.items():
        (container,) = the(build, "DaemonSet", "inferwatch-exporter")["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["image"].endswith(f":{project_version()}"), build_name


def test_every_base_object_is_part_of_inferwatch(kustomize_builds: dict) -> None:
    for obj in kustomize_builds["base"]:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "inferwatch", obj["metadata"]["name"]


def test_the_validators_reject_a_misspelt_field(kustomize_builds: dict) -> None:
    """The checks above can fail: a typo the API server would prune silently is caught."""
    build = kustomize_builds["base"]
    monitor = copy.deepcopy(the(build, "ServiceMonitor", "inferwatch-exporter"))
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "15s"
    assert list(jsonschema.Draft202012Validator(SCHEMAS["ServiceMonitor"]).iter_errors(monitor))
    daemonset = copy.deepcopy(the(build, "DaemonSet", "inferwatch-exporter"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[0], strict=True)
