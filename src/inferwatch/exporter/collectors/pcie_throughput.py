"""PCIe throughput (opt-in: ``--collector.pcie_throughput``), for GPUs whose GPM does not give it.

Each reading makes NVML count bytes over a 20 ms window and blocks for it (22 ms measured on an H200),
so the two directions cost over 40 ms per GPU per poll: more than everything else together. With the GPM
collector on, a GPU that has GPM gets the figures from its counters instead (:mod:`.gpm`) and is never
read here: whether it has GPM is asked once per GPU and session (:meth:`~..nvml.GpuContext.has_gpm`),
not looked up in what the GPM collector emitted, so the two run in any order.
"""

from __future__ import annotations

from ..nvml import GpuContext
from .registry import Registration, register
from .series import PCIE_RX, PCIE_TX

# nvmlPcieUtilCounter_t; NVML reports KB/s, taken as KiB/s like nvidia-smi does.
_DIRECTIONS = ((PCIE_TX, 0), (PCIE_RX, 1))
_KIB = 1024


class PcieThroughputCollector:
    name = "pcie_throughput"

    def __init__(self, gpm_reads_pcie: bool) -> None:
        self._gpm_reads_pcie = gpm_reads_pcie  # the GPM collector is on, and reads it where it can

    def collect(self, gpu: GpuContext) -> None:
        if self._gpm_reads_pcie and gpu.has_gpm():
            return
        for spec, counter in _DIRECTIONS:
            kib_per_second = gpu.read("nvmlDeviceGetPcieThroughput", counter)
            if kib_per_second is not None:
                gpu.emit(spec, kib_per_second * _KIB)


register(
    Registration(
        "pcie_throughput",
        "PCIe TX/RX throughput; each reading blocks ~20 ms per direction and GPU",
        default=False,
        gpu=lambda config, settings, shared: [PcieThroughputCollector(config.enabled("gpm"))],
        aliases=("--collector.pcie-throughput",),
    )
)
