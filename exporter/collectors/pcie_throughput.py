"""PCIe throughput (opt-in: ``--collector.pcie-throughput``), for GPUs whose GPM does not give it.

Each reading makes NVML count bytes over a 20 ms window and blocks for it (22 ms measured on an H200),
so the two directions cost over 40 ms per GPU per poll: more than everything else together. Where the
GPM collector, which runs first, already had the figures from its counters, they are not read again.
"""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_gauge

TX = gpu_gauge(
    "gpu_pcie_tx_bytes_per_second",
    "PCIe transmit throughput: over the GPM window where the GPU has GPM, else over 20 ms at the poll.",
)
RX = gpu_gauge(
    "gpu_pcie_rx_bytes_per_second",
    "PCIe receive throughput: over the GPM window where the GPU has GPM, else over 20 ms at the poll.",
)

# nvmlPcieUtilCounter_t; NVML reports KB/s, taken as KiB/s like nvidia-smi does.
_DIRECTIONS = ((TX, 0), (RX, 1))
_KIB = 1024


class PcieThroughputCollector:
    name = "pcie_throughput"

    def collect(self, gpu: GpuContext) -> None:
        if any(sample.spec in (TX, RX) for sample in gpu.samples):
            return
        for spec, counter in _DIRECTIONS:
            kib_per_second = gpu.read("nvmlDeviceGetPcieThroughput", counter)
            if kib_per_second is not None:
                gpu.emit(spec, kib_per_second * _KIB)
