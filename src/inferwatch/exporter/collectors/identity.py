"""Identity of each GPU (one ``gpu_info`` series) and its persistence mode."""

from __future__ import annotations

from ..nvml import GpuContext, text
from ..samples import gpu_gauge
from .registry import Registration, register

GPU_INFO = gpu_gauge(
    "gpu_info",
    "Identity of the GPU; always 1. Join on gpu/uuid to label other series.",
    "name",
    "driver_version",
    "cuda_driver_version",
    "pci_bus_id",
    "serial",
    "vbios_version",
    "compute_capability",
)
PERSISTENCE_MODE = gpu_gauge(
    "gpu_persistence_mode", "1 when persistence mode is on (the driver stays loaded with no client)."
)


class IdentityCollector:
    name = "identity"

    def collect(self, gpu: GpuContext) -> None:
        pci = gpu.cached("nvmlDeviceGetPciInfo")
        capability = gpu.cached("nvmlDeviceGetCudaComputeCapability")
        gpu.emit(
            GPU_INFO,
            1,
            _text_or_empty(gpu.cached("nvmlDeviceGetName")),
            gpu.device.driver_version,
            gpu.device.cuda_driver_version,
            _text_or_empty(pci.busId if pci is not None else None),
            _text_or_empty(gpu.cached("nvmlDeviceGetSerial")),
            _text_or_empty(gpu.cached("nvmlDeviceGetVbiosVersion")),
            "{}.{}".format(*capability) if capability is not None else "",
        )
        mode = gpu.read("nvmlDeviceGetPersistenceMode")
        if mode is not None:
            gpu.emit(PERSISTENCE_MODE, mode)


def _text_or_empty(value: bytes | str | None) -> str:
    return "" if value is None else text(value)


register(
    Registration(
        "identity",
        "GPU identity (one gpu_info series) and persistence mode",
        gpu=lambda config, settings, shared: [IdentityCollector()],
    )
)
