"""PodResources device IDs to GPUs and MIG devices, and processes to pods through the GPUs they run on."""

from __future__ import annotations

import pytest

from inferwatch.exporter.collectors.kubernetes import name_containers
from inferwatch.exporter.kubernetes.cgroup import ContainerRef
from inferwatch.exporter.kubernetes.devices import DeviceRef, MigDevice, parse_device_id

GPU = "GPU-b7b5b4c4-8a2c-7a2e-3f1d-0e9c8b7a6f5e"
OLD_MIG_PARENT = "GPU-1f2e3d4c-5b6a-7988-a7b6-c5d4e3f2a1b0"
MIG = "MIG-4a3b2c1d-0e9f-5a8b-9c7d-6e5f4a3b2c1d"
MIGS = (MigDevice("MIG-aaaa", 0, 1), MigDevice(MIG, 1, 2), MigDevice("MIG-cccc", 2, 5))


@pytest.mark.parametrize(
    ("device_id", "index", "uuid", "where"),
    [
        # Whole GPUs: by UUID (the NVIDIA device plugin's default), by index, by GKE's device name.
        (GPU, 3, GPU, ""),
        ("3", 3, GPU, ""),
        ("nvidia3", 3, GPU, ""),
        # A shared GPU: each replica names the GPU.
        (f"{GPU}::0", 3, GPU, ""),
        (f"{GPU}::7", 3, GPU, ""),
        ("3::2", 3, GPU, ""),
        ("nvidia3/vgpu1", 3, GPU, ""),
        # MIG devices: by UUID, by index and slot, by the pre-R470 form and GKE's (GPU instance ids).
        (MIG, 3, GPU, MIG),
        (f"{MIG}::1", 3, GPU, MIG),
        ("3:1", 3, GPU, MIG),
        (f"MIG-{GPU}/2/0", 3, GPU, MIG),
        ("nvidia3/gi2", 3, GPU, MIG),
    ],
)
def test_each_form_names_its_gpu_or_mig_device(device_id: str, index: int, uuid: str, where: str) -> None:
    ref = parse_device_id(device_id)
    assert ref is not None
    assert ref.on(index, uuid, MIGS) == where


@pytest.mark.parametrize(
    "device_id",
    [GPU, "3", "nvidia3", f"{GPU}::1", MIG, "3:1", f"MIG-{GPU}/2/0", "nvidia3/gi2"],
)
def test_another_gpu_is_not_named(device_id: str) -> None:
    ref = parse_device_id(device_id)
    assert ref is not None
    assert ref.on(4, OLD_MIG_PARENT, ()) is None


def test_a_mig_device_not_among_the_gpu_s_is_not_named_nor_taken_for_the_whole_gpu() -> None:
    for device_id in ("MIG-0000ffff-0000-4000-8000-000000000000", "3:6", "nvidia3/gi9"):
        ref = parse_device_id(device_id)
        assert ref is not None and ref.is_mig
        assert ref.on(3, GPU, MIGS) is None


def test_forms_not_known_are_none() -> None:
    for device_id in ("", "gpu", "GPU", "MIG-", "nvidia", "3:", "::1", "abc/def", "GPU-xyz"):
        assert parse_device_id(device_id) is None, device_id


def test_a_whole_gpu_s_reference_is_not_mig() -> None:
    assert parse_device_id(GPU) == DeviceRef(gpu_uuid=GPU)
    assert not DeviceRef(gpu_index=0).is_mig


# --- naming processes' pods through their GPUs ---------------------------------------------------------

UID_A, UID_B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
CID_A1, CID_A2, CID_B = "a1" * 32, "a2" * 32, "b0" * 32
A_MAIN = ("team", "llm-a", "main")
A_SIDE = ("team", "llm-a", "sidecar")
B_MAIN = ("team", "llm-b", "main")


def test_a_process_on_a_gpu_one_container_holds_is_named_and_its_pod_s_other_processes_too() -> None:
    containers = {10: ContainerRef(UID_A, CID_A1), 11: ContainerRef(UID_A, CID_A2)}
    pods, names = name_containers(containers, {10: {"GPU-0"}}, {"GPU-0": {A_MAIN}})
    assert pods == {UID_A: ("team", "llm-a")}
    assert names == {CID_A1: "main"}  # the sidecar's process holds no GPU: its container stays unnamed


def test_a_gpu_two_containers_of_one_pod_hold_names_the_pod_only() -> None:
    containers = {10: ContainerRef(UID_A, CID_A1)}
    pods, names = name_containers(containers, {10: {"GPU-0"}}, {"GPU-0": {A_MAIN, A_SIDE}})
    assert pods == {UID_A: ("team", "llm-a")}
    assert names == {}


def test_a_gpu_shared_by_two_pods_names_neither() -> None:
    containers = {10: ContainerRef(UID_A, CID_A1), 20: ContainerRef(UID_B, CID_B)}
    gpus = {10: {"GPU-0"}, 20: {"GPU-0"}}
    assert name_containers(containers, gpus, {"GPU-0": {A_MAIN, B_MAIN}}) == ({}, {})


def test_a_pod_on_a_gpu_it_did_not_request_makes_that_gpu_s_processes_unnamed() -> None:
    # Pod B reaches GPU 0 without requesting it (NVIDIA_VISIBLE_DEVICES=all): PodResources lists pod A
    # only, so two pod UIDs claim pod A.
    containers = {10: ContainerRef(UID_A, CID_A1), 20: ContainerRef(UID_B, CID_B)}
    gpus = {10: {"GPU-0"}, 20: {"GPU-0"}}
    assert name_containers(containers, gpus, {"GPU-0": {A_MAIN}}) == ({}, {})


def test_processes_of_two_pods_on_gpus_of_their_own_are_each_named() -> None:
    containers = {10: ContainerRef(UID_A, CID_A1), 20: ContainerRef(UID_B, CID_B)}
    gpus = {10: {"GPU-0", "GPU-1"}, 20: {"GPU-2"}}
    holders = {"GPU-0": {A_MAIN}, "GPU-1": {A_MAIN}, "GPU-2": {B_MAIN}}
    pods, names = name_containers(containers, gpus, holders)
    assert pods == {UID_A: ("team", "llm-a"), UID_B: ("team", "llm-b")}
    assert names == {CID_A1: "main", CID_B: "main"}


def test_without_pod_resources_nothing_is_named() -> None:
    containers = {10: ContainerRef(UID_A, CID_A1)}
    assert name_containers(containers, {10: {"GPU-0"}}, {}) == ({}, {})
    assert name_containers(containers, {}, {"GPU-0": {A_MAIN}}) == ({}, {})
