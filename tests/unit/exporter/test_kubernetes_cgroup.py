"""The pod and container of a process from ``/proc/<pid>/cgroup``, on contents as each cgroup version,
kubelet cgroup driver and container runtime writes them."""

from __future__ import annotations

import pytest

from inferwatch.exporter.kubernetes import cgroup
from inferwatch.exporter.kubernetes.cgroup import ContainerRef, parse_cgroup, read_container

UID = "7b2e9c4e-1d6f-4b8a-9e2a-3c5d7f9a1b2c"
SYSTEMD_UID = UID.replace("-", "_")
ID = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
KIND_NODE = "e" * 64  # the Docker container that is kind's node
STATIC_UID = "6a1b2c3d4e5f60718293a4b5c6d7e8f9"  # a static pod's: the hash of its manifest

V1_CONTROLLERS = (
    "hugetlb",
    "perf_event",
    "net_cls,net_prio",
    "pids",
    "cpu,cpuacct",
    "memory",
    "freezer",
    "devices",
    "blkio",
    "cpuset",
)


def v1(path: str) -> str:
    """A cgroup v1 file: one line per hierarchy, the same path in each (as the kubelet sets them), and the
    empty unified hierarchy of a hybrid setup last."""
    lines = [f"{12 - i}:{c}:{path}" for i, c in enumerate(V1_CONTROLLERS)]
    return "\n".join([*lines, f"1:name=systemd:{path}", "0::/", ""])


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver: containerd (kubeadm and most managed clusters), CRI-O (OpenShift),
        # Docker through cri-dockerd.
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/crio-{ID}.scope\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{ID}.scope\n",
        # Guaranteed pods sit right under kubepods.slice.
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        # cgroup v1, systemd driver (Docker on an older node image).
        v1(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{ID}.scope"
        ),
        # cgroup v1 and v2, cgroupfs driver: containerd and Docker name the container by its ID alone,
        # CRI-O with a prefix.
        v1(f"/kubepods/burstable/pod{UID}/{ID}"),
        v1(f"/kubepods/besteffort/pod{UID}/crio-{ID}"),
        v1(f"/kubepods/pod{UID}/{ID}"),
        f"0::/kubepods/burstable/pod{UID}/{ID}\n",
        # Read from a container with a cgroup namespace of its own (cgroup v2's default): the path is
        # relative to the reader's cgroup.
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
        f"0::/../../../besteffort/pod{UID}/{ID}\n",
        # A cgroup of the process's own below its container's (systemd or a supervisor in the container).
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope/init.scope\n",
        # kind: the kubelet runs in a Docker container with its own slice prefix.
        f"0::/system.slice/docker-{KIND_NODE}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n",
    ],
)
def test_a_container_s_process_gives_its_pod_uid_and_container_id(text: str) -> None:
    assert parse_cgroup(text) == ContainerRef(UID, ID)


def test_a_static_pod_s_uid_is_its_manifest_hash() -> None:
    text = v1(f"/kubepods/burstable/pod{STATIC_UID}/{ID}")
    assert parse_cgroup(text) == ContainerRef(STATIC_UID, ID)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/kubelet.service\n",
        "0::/system.slice/containerd.service\n",
        # A container that is no pod's: plain Docker, both drivers.
        f"0::/system.slice/docker-{ID}.scope\n",
        v1(f"/docker/{ID}"),
        # CRI-O's conmon watches a container from the pod's cgroup; it is not the container's process.
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/crio-conmon-{ID}.scope\n",
        # The pod's own cgroup, outside every container.
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice\n",
        # Not a container ID (too short) where one would be.
        f"0::/kubepods/burstable/pod{UID}/{ID[:12]}\n",
    ],
)
def test_a_process_outside_any_pod_s_container_has_none(text: str) -> None:
    assert parse_cgroup(text) is None


def test_read_container_reads_the_process_s_file_and_a_missing_one_is_none(tmp_path, monkeypatch) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{ID}\n")
    monkeypatch.setattr(cgroup, "PROC", str(tmp_path))
    assert read_container(42) == ContainerRef(UID, ID)
    assert read_container(43) is None
