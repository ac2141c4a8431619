"""Kubernetes attribution in-process: the poller over the NVML stand-in, and the kubelet's PodResources API
served by the stand-in kubelet (tests/support/kubelet.py), a real gRPC server on a unix socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch.common.lograte import RateLimit
from inferwatch.exporter.kubernetes import cgroup, podresources
from inferwatch.exporter.kubernetes.podresources import LIST_METHOD, SERVICE
from tests.support import REPO_ROOT, fake_nvml, parse_samples, sample_value
from tests.support.kubelet import Pod, PodResourcesServer, gpu_pod
from tests.unit.exporter.conftest import MakePoller, own_process, render

POD_INFO = "gpu_kubernetes_pod_info"
ERRORS = "inferwatch_exporter_kubernetes_errors_total"
UP = "inferwatch_exporter_kubernetes_up"
MIG_1G = "nvidia.com/mig-1g.18gb"


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "kubelet.sock")


@pytest.fixture
def kubelet(socket_path: str) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(socket_path) as server:
        yield server


@pytest.fixture
def k8s_poller(make_poller: MakePoller, socket_path: str) -> MakePoller:
    """Pollers that ask the stand-in kubelet, with a short List timeout."""

    def make(kubernetes: dict[str, Any] | None = None, **config: Any) -> Any:
        return make_poller(kubernetes={"timeout": 0.5, "socket": socket_path, **(kubernetes or {})}, **config)

    return make


def pod_series(text: str) -> set[tuple[str, ...]]:
    """(gpu, mig_uuid, resource, namespace, pod, container) of every pod info series."""
    keys = ("gpu", "mig_uuid", "resource", "namespace", "pod", "container")
    found = set()
    for sample in parse_samples(text):
        if sample.name == POD_INFO:
            assert sample.value == 1
            assert sample.labels["uuid"] == fake_nvml.gpu_uuid(int(sample.labels["gpu"]))
            found.add(tuple(sample.labels[k] for k in keys))
    return found


def listed(poller: Any) -> str:
    """List once, collect once, and the scrape's text."""
    poller.pods.watcher.refresh()
    poller.collect()
    return render(poller)


def test_the_service_is_the_published_one() -> None:
    from inferwatch.exporter.kubernetes import podresources_pb2

    service = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == SERVICE
    assert f"/{service.full_name}/{service.methods_by_name['List'].name}" == LIST_METHOD


def test_whole_gpus_by_uuid_or_index_give_one_series_per_container(
    k8s_poller: MakePoller, fake: Any, kubelet: PodResourcesServer
) -> None:
    fake.reset(gpus=4)
    kubelet.pods = [
        gpu_pod("team-a", "llm-0", fake_nvml.gpu_uuid(1)),
        Pod("team-b", "train-7f9c", {"worker": {"nvidia.com/gpu": ["2", "3"]}, "logger": {}}),
        # Two containers of one pod, each with a GPU; and a resource that is no GPU.
        Pod(
            "team-c",
            "infer-1",
            {"a": {"nvidia.com/gpu": [fake_nvml.gpu_uuid(0)]}, "b": {"example.com/fpga": ["fpga0"]}},
        ),
    ]
    text = listed(k8s_poller())
    gpu = "nvidia.com/gpu"
    assert pod_series(text) == {
        ("0", "", gpu, "team-c", "infer-1", "a"),
        ("1", "", gpu, "team-a", "llm-0", "main"),
        ("2", "", gpu, "team-b", "train-7f9c", "worker"),
        ("3", "", gpu, "team-b", "train-7f9c", "worker"),
    }
    assert sample_value(text, UP) == 1
    assert sample_value(text, ERRORS) == 0


def test_a_shared_gpu_gives_one_series_per_pod_holding_replicas_of_it(
    k8s_poller: MakePoller, fake: Any, kubelet: PodResourcesServer
) -> None:
    uuid = fake_nvml.gpu_uuid(1)
    kubelet.pods = [
        gpu_pod("ns", "a", f"{uuid}::0", f"{uuid}::3"),  # two replicas, one container: one series
        gpu_pod("ns", "b", f"{uuid}::1", resource="nvidia.com/gpu.shared"),
        gpu_pod("ns", "c", "1::2"),
    ]
    assert pod_series(listed(k8s_poller())) == {
        ("1", "", "nvidia.com/gpu", "ns", "a", "main"),
        ("1", "", "nvidia.com/gpu.shared", "ns", "b", "main"),
        ("1", "", "nvidia.com/gpu", "ns", "c", "main"),
    }


def test_mig_devices_are_named_by_their_uuid_on_their_gpu(
    k8s_poller: MakePoller, fake: Any, kubelet: PodResourcesServer
) -> None:
    fake.reset(gpus=2, mig=[1])  # MIG devices in slots 0 and 1 of GPU 1
    kubelet.pods = [
        gpu_pod("ml", "small-0", fake_nvml.mig_uuid(1, 0), resource=MIG_1G),
        gpu_pod("ml", "small-1", "1:1", resource=MIG_1G),  # index strategy: GPU index, MIG slot
        gpu_pod("ml", "gone", fake_nvml.mig_uuid(1, 5), resource=MIG_1G),  # no such MIG device now
        gpu_pod("ml", "whole", fake_nvml.gpu_uuid(0)),
    ]
    assert pod_series(listed(k8s_poller())) == {
        ("1", fake_nvml.mig_uuid(1, 0), MIG_1G, "ml", "small-0", "main"),
        ("1", fake_nvml.mig_uuid(1, 1), MIG_1G, "ml", "small-1", "main"),
        ("0", "", "nvidia.com/gpu", "ml", "whole", "main"),
    }


def test_resources_can_be_chosen(k8s_poller: MakePoller, kubelet: PodResourcesServer) -> None:
    kubelet.pods = [gpu_pod("ns", "a", "0"), gpu_pod("ns", "b", "1", resource="example.com/shared-gpu")]
    poller = k8s_poller(kubernetes={"resources": ("example.com/*",)})
    assert pod_series(listed(poller)) == {("1", "", "example.com/shared-gpu", "ns", "b", "main")}


def test_pods_that_go_away_take_their_series_with_them(
    k8s_poller: MakePoller, kubelet: PodResourcesServer
) -> None:
    kubelet.pods = [gpu_pod("ns", "a", "0"), gpu_pod("ns", "b", "1")]
    poller = k8s_poller()
    assert len(pod_series(listed(poller))) == 2
    kubelet.pods = [gpu_pod("ns", "b", "1")]
    assert pod_series(listed(poller)) == {("1", "", "nvidia.com/gpu", "ns", "b", "main")}


def test_no_socket_means_no_pod_series_and_grpc_is_never_imported(tmp_path: Path) -> None:
    script = """
import json, sys
from inferwatch.exporter.config import ExporterConfig
from inferwatch.exporter.exposition import ScrapeRenderer
from inferwatch.exporter.poller import Poller
from tests.support import fake_nvml

config = ExporterConfig().with_settings("kubernetes", socket=sys.argv[1]).switched(xid=False)
poller = Poller(config, fake_nvml, "test")
poller.pods.watcher.refresh()
poller.collect()
text = ScrapeRenderer(poller).render(None)[0].decode()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "google"))
print(json.dumps({"text": text, "loaded": loaded}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "absent.sock")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    out = json.loads(result.stdout)
    assert out["loaded"] == []
    text = out["text"]
    assert POD_INFO not in text
    assert sample_value(text, UP) == 0
    assert sample_value(text, ERRORS, error="socket_absent") == 1
    assert sample_value(text, ERRORS, error="timeout") == 0
    assert sample_value(text, "gpu_up", gpu="1") == 1


@pytest.mark.parametrize(
    "pods",
    [
        [gpu_pod("Not A Namespace", "a", "0")],
        [gpu_pod("ns", "", "0")],
        [Pod("ns", "a", {"": {"nvidia.com/gpu": ["0"]}})],
        [gpu_pod("ns", "a", "GPU 0 with spaces")],
        [gpu_pod("ns", "a", "0", resource="nvidia.com/mig-1g 18gb")],
        [gpu_pod("ns", f"p{i}", *[f"GPU-{i:08x}::{r}" for r in range(100)]) for i in range(50)],
    ],
    ids=["namespace", "empty-pod", "empty-container", "device-id", "resource", "too-many-devices"],
)
def test_an_answer_no_kubelet_gives_is_malformed_and_gives_no_series(
    k8s_poller: MakePoller, kubelet: PodResourcesServer, pods: list[Pod]
) -> None:
    kubelet.pods = [gpu_pod("ns", "good", "1"), *pods]
    text = listed(k8s_poller())
    assert POD_INFO not in text
    assert sample_value(text, ERRORS, error="malformed") == 1
    assert sample_value(text, UP) == 0


def test_garbage_is_malformed_and_a_good_answer_afterwards_brings_the_series_back(
    k8s_poller: MakePoller,
    kubelet: PodResourcesServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The log's rate limit is the process's: earlier tests' failures must not use this one's up.
    monkeypatch.setattr(podresources.log, "filters", [RateLimit()])
    kubelet.pods = [gpu_pod("ns", "a", "0")]
    kubelet.mode = "garbage"
    poller = k8s_poller()
    for _ in range(3):
        text = listed(poller)
    assert POD_INFO not in text
    assert sample_value(text, ERRORS, error="malformed") == 3
    # One line for the failure, not one per List, and no traceback from gRPC's decoding.
    failures = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.name.startswith("grpc")]
    kubelet.mode = "answer"
    text = listed(poller)
    assert pod_series(text) == {("0", "", "nvidia.com/gpu", "ns", "a", "main")}
    assert sample_value(text, UP) == 1


def test_the_pods_collector_fails_alone(
    k8s_poller: MakePoller, kubelet: PodResourcesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferwatch.exporter.kubernetes.devices import DeviceRef

    kubelet.pods = [gpu_pod("ns", "a", "0")]

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(DeviceRef, "on", broken)
    text = listed(k8s_poller())
    assert POD_INFO not in text
    assert sample_value(text, "inferwatch_exporter_collector_errors_total", collector="kubernetes") == 2
    assert sample_value(text, "gpu_power_watts", gpu="0") == 350


# --- processes ------------------------------------------------------------------------------------------

POD_UID = "0f1e2d3c-4b5a-4697-8877-665544332211"
MAIN_ID, SIDECAR_ID = "a" * 64, "b" * 64


def fake_cgroups(root: Path, cgroups: dict[int, str]) -> None:
    """A /proc of ``pid -> container ID`` cgroup files for the pod POD_UID (systemd driver, containerd)."""
    slice_ = f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice"
    for pid, container_id in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        path = f"/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{container_id}.scope"
        (root / str(pid) / "cgroup").write_text(f"0::{path}\n")


def test_processes_get_their_pod_from_the_cgroup_named_through_the_gpu_they_hold(
    k8s_poller: MakePoller,
    fake: Any,
    kubelet: PodResourcesServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sidecar = subprocess.Popen(["sleep", "60"])
    try:
        fake.reset(gpus=2, processes={0: own_process()})
        kubelet.pods = [gpu_pod("team-a", "llm-0", fake_nvml.gpu_uuid(0), container="server")]
        fake_cgroups(tmp_path / "proc", {os.getpid(): MAIN_ID, sidecar.pid: SIDECAR_ID})
        monkeypatch.setattr(cgroup, "PROC", str(tmp_path / "proc"))
        pid_file = tmp_path / "sidecar.pid"
        pid_file.write_text(str(sidecar.pid))
        text = listed(k8s_poller(processes={"pid_files": (str(pid_file),)}))
    finally:
        sidecar.kill()
        sidecar.wait()
    info = {
        s.labels["pid"]: s.labels
        for s in parse_samples(text)
        if s.name == "inferwatch_process_kubernetes_info"
    }
    pod = {"pod_uid": POD_UID, "namespace": "team-a", "pod": "llm-0"}
    assert info[str(os.getpid())] == {
        "pid": str(os.getpid()),
        "comm": info[str(os.getpid())]["comm"],
        **pod,
        "container_id": MAIN_ID,
        "container": "server",
    }
    # The sidecar holds no GPU: its pod is known through its pod UID, its container's name is not.
    assert info[str(sidecar.pid)] == {
        "pid": str(sidecar.pid),
        "comm": "sleep",
        **pod,
        "container_id": SIDECAR_ID,
        "container": "",
    }


def test_processes_outside_pods_have_no_kubernetes_series(
    k8s_poller: MakePoller, fake: Any, kubelet: PodResourcesServer, tmp_path: Path, monkeypatch: Any
) -> None:
    fake.reset(gpus=1, processes={0: own_process()})
    kubelet.pods = [gpu_pod("ns", "a", "0")]
    (tmp_path / str(os.getpid())).mkdir()
    (tmp_path / str(os.getpid()) / "cgroup").write_text("0::/user.slice/user-1000.slice/session-1.scope\n")
    monkeypatch.setattr(cgroup, "PROC", str(tmp_path))
    text = listed(k8s_poller())
    assert "inferwatch_process_kubernetes_info" not in text
    assert POD_INFO in text


def test_without_the_collector_there_is_neither_a_thread_nor_a_series(make_poller: MakePoller) -> None:
    poller = make_poller(kubernetes=False)
    poller.start()
    poller.collect()
    text = render(poller)
    assert poller.pods is None
    assert "kubernetes" not in text
    assert not [t for t in threading.enumerate() if t.name == "kubernetes"]
