"""GPU faults and links (NVML): XID and ECC errors, remapped rows, whether the GPU answers, PCIe, and
memory per process."""

from __future__ import annotations

from inferwatch.common import names, promql

from ..grafana import PanelSpec, above, below, normal
from .queries import gpu, query


def xid_errors() -> PanelSpec:
    return PanelSpec(
        "XID errors",
        "XID errors reported by the driver, by code; InferwatchGpuXidError pages on the hardware and "
        "driver ones.",
        "short",
        above(1),
        [query(promql.increase(gpu(names.GPU_XID_ERRORS_TOTAL)), "GPU {{gpu}} XID {{xid}}")],
    )


def ecc_errors() -> PanelSpec:
    return PanelSpec(
        "ECC errors",
        "Corrected and uncorrected ECC errors, volatile (since driver load) and aggregate.",
        "short",
        above(1),
        [query(promql.increase(gpu(names.GPU_ECC_ERRORS_TOTAL)), "GPU {{gpu}} {{type}} {{scope}}")],
    )


def remapped_rows() -> PanelSpec:
    return PanelSpec(
        "Remapped rows",
        "Memory rows replaced by spares, by cause; pending (needs a GPU reset) and failed (no spare left).",
        "short",
        above(1),
        [
            query(gpu(names.GPU_REMAPPED_ROWS), "GPU {{gpu}} {{cause}}"),
            query(gpu(names.GPU_REMAPPED_ROWS_PENDING), "GPU {{gpu}} pending"),
            query(gpu(names.GPU_REMAPPED_ROWS_FAILED), "GPU {{gpu}} failed"),
        ],
    )


def gpu_up() -> PanelSpec:
    return PanelSpec(
        "GPU answers",
        "1 while the exporter reads the GPU; 0 when it is lost (fell off the bus), hung, or NVML fails.",
        "none",
        below(1),
        [query(gpu(names.GPU_UP), "GPU {{gpu}} {{instance}}")],
    )


def pcie_link() -> PanelSpec:
    return PanelSpec(
        "PCIe link",
        "Current PCIe generation and width next to the maximum: a link trained below its maximum slows "
        "every host-device copy.",
        "none",
        normal(),
        [
            query(gpu(names.GPU_PCIE_LINK_GEN), "gen GPU {{gpu}}"),
            query(gpu(names.GPU_PCIE_LINK_MAX_GEN), "max gen GPU {{gpu}}"),
            query(gpu(names.GPU_PCIE_LINK_WIDTH), "width GPU {{gpu}}"),
            query(gpu(names.GPU_PCIE_LINK_MAX_WIDTH), "max width GPU {{gpu}}"),
        ],
    )


def pcie_traffic() -> PanelSpec:
    return PanelSpec(
        "PCIe throughput and replays",
        "Transmit and receive throughput (from GPM where the GPU has it, else only with "
        "--collector.pcie_throughput) and link-level replays per second (a rising rate means a bad link "
        "or riser).",
        "Bps",
        normal(),
        [
            query(gpu(names.GPU_PCIE_TX_BYTES_PER_SECOND), "tx GPU {{gpu}}"),
            query(gpu(names.GPU_PCIE_RX_BYTES_PER_SECOND), "rx GPU {{gpu}}"),
            query(promql.rate(gpu(names.GPU_PCIE_REPLAYS_TOTAL)), "replays/s GPU {{gpu}}"),
        ],
    )


def process_gpu_memory() -> PanelSpec:
    return PanelSpec(
        "GPU memory by process",
        "Device memory per compute process (the largest ones), as the driver sees it.",
        "bytes",
        normal(),
        [query(gpu(names.GPU_PROCESS_MEMORY_BYTES), "GPU {{gpu}} {{comm}} ({{pid}})")],
    )
