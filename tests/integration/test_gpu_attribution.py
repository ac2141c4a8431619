"""Which model, which pod, on which GPU: the join by GPU UUID, end to end on a CPU machine.

A node with eight GPUs (the exporter over the NVML stand-in, tests/support/fake_nvml.py) and two
serving processes, each given one GPU as CUDA_VISIBLE_DEVICES or a device plugin gives it: both call it
``cuda:0``, and they hold GPUs 2 and 5 (served expositions stand in for GPU serving processes:
tests/support/gpu_serving.py). The kubelet's PodResources API (a gRPC stand-in on a unix socket,
tests/support/kubelet.py) says which pod holds each GPU, and GPU 5 is in hardware slowdown. A real
Prometheus scrapes all three; ``diagnose``, ``top --once --json``, the dashboards' "Each model's GPU"
query and the hardware-slowdown alert must each put each model, and its pod, on its own GPU. A join by
device index or by host would put both models on GPU 0: every process here is on 127.0.0.1 and says
``cuda:0``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from tests.support import PACKAGE_ROOT, REPO_ROOT
from tests.support.fake_nvml import gpu_uuid
from tests.support.gpu_serving import GpuServing, gpu_serving
from tests.support.kubelet import PodResourcesServer, gpu_pod
from tests.support.services import Prometheus, run_inferwatch, start_exporter, start_prometheus, wait_until

pytestmark = pytest.mark.integration

SERVING_JOB = "llm-serving"
EXPORTER_JOB = "inferwatch-exporter"
GPUS = {"llama-a": 2, "llama-b": 5}  # model -> the stand-in GPU its process was given
PODS = {"llama-a": ("llm", "llama-a-0"), "llama-b": ("llm", "llama-b-0")}
SLOWED_GPU = 5
SLOWDOWN = "InferwatchGpuHardwareSlowdown"


@dataclass
class Node:
    prometheus: Prometheus
    exporter: str
    serving: dict[str, GpuServing]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("attribution")
    rules = workdir / "rules.yaml"
    rules.write_text(rules_yaml(merge_config({"alerts": {SLOWDOWN: {"for": "0s"}}})))
    socket = workdir / "kubelet.sock"
    pods = [
        gpu_pod(namespace, name, gpu_uuid(GPUS[model]), container="server")
        for model, (namespace, name) in PODS.items()
    ]
    fake_nvml = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": 8, "hw_slowdown": [SLOWED_GPU]}),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with ExitStack() as services:
        services.enter_context(PodResourcesServer(socket, pods))
        serving = {model: services.enter_context(gpu_serving(model, gpu)) for model, gpu in GPUS.items()}
        _, exporter = services.enter_context(
            start_exporter(
                extra_args=["--collector.interval=500ms", f"--kubernetes.pod-resources-socket={socket}"],
                env=fake_nvml,
                workdir=workdir,
            )
        )
        prometheus = services.enter_context(
            start_prometheus(
                {SERVING_JOB: [s.address for s in serving.values()], EXPORTER_JOB: [exporter]},
                [rules],
                workdir=workdir / "prometheus",
            )
        )
        prometheus.wait_for_targets_up(60)
        prometheus.wait_for_series('gpu_kubernetes_pod_info{pod="llama-b-0"}', 60)
        yield Node(prometheus, exporter, serving)


def users(model: str, node: Node) -> list[str]:
    """Who uses the GPU of ``model``, as diagnose and top name them."""
    namespace, pod = PODS[model]
    return [f"model {model} on {node.serving[model].address}", f"pod {namespace}/{pod}"]


def test_top_puts_each_model_and_pod_on_its_gpu(node: Node) -> None:
    endpoints = [node.exporter, *(s.address for s in node.serving.values())]
    result = run_inferwatch("top", "--once", "--json", "--window", "1", *endpoints)
    assert result.returncode == 0, result.stderr
    frame = json.loads(result.stdout)
    gpus = {row["gpu"]: row for row in frame["gpus"]}
    assert len(gpus) == 8
    for model, gpu in GPUS.items():
        assert gpus[str(gpu)]["serving"] == users(model, node)
        (row,) = [row for row in frame["models"] if row["model"] == model]
        assert (row["device"], row["gpu_uuid"], row["gpu"]) == ("cuda:0", gpu_uuid(gpu), str(gpu))
    assert [row["serving"] for gpu, row in gpus.items() if int(gpu) not in GPUS.values()] == [[]] * 6
    (slowed,) = [row for row in frame["models"] if row["gpu"] == str(SLOWED_GPU)]
    assert "hw_slowdown" in slowed["gpu_throttle_reasons"]


def test_diagnose_names_the_model_and_pod_on_each_throttled_gpu(node: Node) -> None:
    node.prometheus.wait_for_history("gpu_clocks_event_active", 5)
    result = run_inferwatch(
        "diagnose", "--prometheus", node.prometheus.url, "--window", "30s", "--rate-window", "5s", "--json"
    )
    report = json.loads(result.stdout)
    throttling = {f["subject"]: f for f in report["findings"] if f["check"] == "throttling"}
    for model, gpu in GPUS.items():
        (finding,) = [f for subject, f in throttling.items() if subject.startswith(f"GPU {gpu} ")]
        assert finding["summary"].endswith("; it serves " + ", ".join(users(model, node))), finding
    assert throttling[f"GPU {SLOWED_GPU} on {node.exporter}"]["severity"] == "critical"
    # The GPUs nobody was given: throttled too (the stand-in's power cap), serving no one.
    others = [
        f for subject, f in throttling.items() if not any(subject.startswith(f"GPU {g} ") for g in (2, 5))
    ]
    assert len(others) == 6 and not any("it serves" in f["summary"] for f in others)


def dashboard_expr(title: str) -> list[str]:
    """The expressions of the first panel titled ``title``, with Grafana's "All" in the variables."""
    panels = json.loads((PACKAGE_ROOT / "dashboards" / "inferwatch-overview.json").read_text())["panels"]
    (panel,) = [p for p in panels if p.get("title") == title]
    variables = {'"$model"': '".+"', '"$instance"': '".+"', '"$gpu"': '".+"', "$__rate_interval": "15s"}
    exprs = []
    for target in panel["targets"]:
        expr = target["expr"]
        for variable, value in variables.items():
            expr = expr.replace(variable, value)
        exprs.append(expr)
    return exprs


def test_the_dashboard_puts_each_model_on_its_gpu(node: Node) -> None:
    clock, throttled = dashboard_expr("Each model's GPU: SM clock and throttle time")
    for expr in (clock, throttled):
        series = wait_until(lambda e=expr: node.prometheus.query(e), 30, f"{expr!r} to return series")
        assert {(s["metric"]["model"], s["metric"]["gpu"]) for s in series} == {
            (model, str(gpu)) for model, gpu in GPUS.items()
        }


def test_the_slowdown_alert_names_the_model_and_pod_on_gpu_5(node: Node) -> None:
    def firing() -> list[dict]:
        return [a for a in node.prometheus.alerts() if a["labels"]["alertname"] == SLOWDOWN]

    (alert,) = wait_until(firing, 60, f"{SLOWDOWN} to fire")
    assert alert["labels"]["uuid"] == gpu_uuid(SLOWED_GPU)
    address = node.serving["llama-b"].address
    assert alert["annotations"]["description"].endswith(
        f"Models on it: llama-b on {address}; pods: llm/llama-b-0;"
    ), alert
