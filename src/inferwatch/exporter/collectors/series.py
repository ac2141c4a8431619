"""Metric families that two collectors fill, each for the GPUs the other leaves alone: PCIe throughput
comes from GPM's counters where a GPU has GPM (:mod:`.gpm`), else from NVML's blocking reading
(:mod:`.pcie_throughput`). Defined here so that neither collector imports the other."""

from __future__ import annotations

from ..samples import gpu_gauge

PCIE_TX = gpu_gauge(
    "gpu_pcie_tx_bytes_per_second",
    "PCIe transmit throughput: over the GPM window where the GPU has GPM, else over 20 ms at the poll.",
)
PCIE_RX = gpu_gauge(
    "gpu_pcie_rx_bytes_per_second",
    "PCIe receive throughput: over the GPM window where the GPU has GPM, else over 20 ms at the poll.",
)
