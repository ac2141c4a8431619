"""The GPU identity a serving process puts on its per-device series: NVML's UUID spelling, MIG instances
told from whole GPUs, and the labels on a CPU model."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.instrumentation.device.hardware import DeviceIdentity, driver_gpu_uuid, gpu_identity
from tests.unit.instrumentation.conftest import metric, scrape

GPU = "GPU-5b0b8c2e-7b7f-4c38-2d0e-9e1f3a4b5c6d"
MIG = "MIG-0d9c1b2a-3f4e-5a6b-7c8d-9e0f1a2b3c4d"
# /proc/driver/nvidia/gpus/0000:18:00.0/information as an R5xx driver writes it.
INFORMATION = f"""Model: \t\t NVIDIA H200
IRQ:   \t\t 263
GPU UUID: \t {GPU}
Video BIOS: \t 96.00.99.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:18:00.0
Device Minor: \t 0
GPU Excluded:\t No
"""


def test_a_whole_gpu_is_named_as_nvml_names_it() -> None:
    identity = gpu_identity("cuda:0", GPU.removeprefix("GPU-"), GPU, "")
    assert identity == DeviceIdentity("cuda:0", GPU, "")
    # Under CUDA_VISIBLE_DEVICES=3 the process calls it cuda:0; the UUID is the physical GPU's all the same.
    assert gpu_identity("cuda:0", GPU.removeprefix("GPU-"), GPU, "3").uuid == GPU


def test_a_mig_instance_carries_its_own_uuid_and_its_parents() -> None:
    identity = gpu_identity("cuda:0", MIG.removeprefix("MIG-"), GPU, MIG)
    assert identity.labels == ("cuda:0", GPU, MIG)


def test_without_the_drivers_files_cuda_visible_devices_tells_a_mig_instance() -> None:
    assert gpu_identity("cuda:0", MIG.removeprefix("MIG-"), None, f"{MIG}").labels == ("cuda:0", "", MIG)
    assert gpu_identity("cuda:1", GPU.removeprefix("GPU-"), None, "0,1").labels == ("cuda:1", GPU, "")
    assert gpu_identity("cuda:0", "", None, "").labels == ("cuda:0", "", "")


@pytest.mark.parametrize("content", [INFORMATION, INFORMATION.replace("\t", "  ")])
def test_the_drivers_information_file_gives_the_gpu_uuid(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "0000:18:00.0"
    folder.mkdir()
    (folder / "information").write_text(content)
    assert driver_gpu_uuid(folder) == GPU
    assert driver_gpu_uuid(tmp_path / "0000:19:00.0") is None


def test_a_cpu_model_has_empty_gpu_labels(llama, registry, instrumented) -> None:
    instrumented(llama, model_name="m")
    assert metric(registry, "llm_model_info", model="m", device="cpu", uuid="", mig_uuid="") == 1
    assert 'mig_uuid=""' in scrape(registry)  # empty values are written, as prometheus_client does
