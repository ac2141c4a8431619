"""PCIe link generation and width (current and maximum: a link trained below its maximum is a fault) and
the replay counter (link-level retransmissions: a rising count means a marginal link)."""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_counter, gpu_gauge
from .registry import Registration, register

LINK_GEN = gpu_gauge("gpu_pcie_link_gen", "Current PCIe link generation.")
LINK_WIDTH = gpu_gauge("gpu_pcie_link_width", "Current PCIe link width, in lanes.")
LINK_MAX_GEN = gpu_gauge("gpu_pcie_link_max_gen", "Highest PCIe generation the GPU and its slot support.")
LINK_MAX_WIDTH = gpu_gauge("gpu_pcie_link_max_width", "Widest PCIe link the GPU supports, in lanes.")
REPLAYS = gpu_counter("gpu_pcie_replays_total", "PCIe replays (link-level retransmissions).")


class PcieCollector:
    name = "pcie"

    def collect(self, gpu: GpuContext) -> None:
        for spec, call, cached in (
            (LINK_GEN, "nvmlDeviceGetCurrPcieLinkGeneration", False),
            (LINK_WIDTH, "nvmlDeviceGetCurrPcieLinkWidth", False),
            (LINK_MAX_GEN, "nvmlDeviceGetMaxPcieLinkGeneration", True),
            (LINK_MAX_WIDTH, "nvmlDeviceGetMaxPcieLinkWidth", True),
            (REPLAYS, "nvmlDeviceGetPcieReplayCounter", False),
        ):
            value = gpu.cached(call) if cached else gpu.read(call)
            if value is not None:
                gpu.emit(spec, value)


register(
    Registration(
        "pcie",
        "PCIe link generation, width and replays",
        gpu=lambda config, settings, shared: [PcieCollector()],
    )
)
