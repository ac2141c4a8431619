"""GPU faults and links (NVML): XID and ECC errors, remapped rows, whether the GPU answers, PCIe, and
memory per process."""

from __future__ import annotations

from ..grafana import RATE, PanelSpec, Query, above, below, normal
from .queries import GPU, sel


def xid_errors() -> PanelSpec:
    return PanelSpec(
        "XID errors",
        "XID errors reported by the driver, by code; InferwatchGpuXidError pages on the hardware and "
        "driver ones.",
        "short",
        above(1),
        [Query(f"increase({sel('gpu_xid_errors_total', GPU)}[{RATE}])", "GPU {{gpu}} XID {{xid}}")],
    )


def ecc_errors() -> PanelSpec:
    return PanelSpec(
        "ECC errors",
        "Corrected and uncorrected ECC errors, volatile (since driver load) and aggregate.",
        "short",
        above(1),
        [Query(f"increase({sel('gpu_ecc_errors_total', GPU)}[{RATE}])", "GPU {{gpu}} {{type}} {{scope}}")],
    )


def remapped_rows() -> PanelSpec:
    return PanelSpec(
        "Remapped rows",
        "Memory rows replaced by spares, by cause; pending (needs a GPU reset) and failed (no spare left).",
        "short",
        above(1),
        [
            Query(sel("gpu_remapped_rows", GPU), "GPU {{gpu}} {{cause}}"),
            Query(sel("gpu_remapped_rows_pending", GPU), "GPU {{gpu}} pending"),
            Query(sel("gpu_remapped_rows_failed", GPU), "GPU {{gpu}} failed"),
        ],
    )


def gpu_up() -> PanelSpec:
    return PanelSpec(
        "GPU answers",
        "1 while the exporter reads the GPU; 0 when it is lost (fell off the bus), hung, or NVML fails.",
        "none",
        below(1),
        [Query(sel("gpu_up", GPU), "GPU {{gpu}} {{instance}}")],
    )


def pcie_link() -> PanelSpec:
    return PanelSpec(
        "PCIe link",
        "Current PCIe generation and width next to the maximum: a link trained below its maximum slows "
        "every host-device copy.",
        "none",
        normal(),
        [
            Query(sel("gpu_pcie_link_gen", GPU), "gen GPU {{gpu}}"),
            Query(sel("gpu_pcie_link_max_gen", GPU), "max gen GPU {{gpu}}"),
            Query(sel("gpu_pcie_link_width", GPU), "width GPU {{gpu}}"),
            Query(sel("gpu_pcie_link_max_width", GPU), "max width GPU {{gpu}}"),
        ],
    )


def pcie_traffic() -> PanelSpec:
    return PanelSpec(
        "PCIe throughput and replays",
        "Transmit and receive throughput (only with --collector.pcie-throughput) and link-level replays "
        "per second (a rising rate means a bad link or riser).",
        "Bps",
        normal(),
        [
            Query(sel("gpu_pcie_tx_bytes_per_second", GPU), "tx GPU {{gpu}}"),
            Query(sel("gpu_pcie_rx_bytes_per_second", GPU), "rx GPU {{gpu}}"),
            Query(f"rate({sel('gpu_pcie_replays_total', GPU)}[{RATE}])", "replays/s GPU {{gpu}}"),
        ],
    )


def process_gpu_memory() -> PanelSpec:
    return PanelSpec(
        "GPU memory by process",
        "Device memory per compute process (the largest ones), as the driver sees it.",
        "bytes",
        normal(),
        [Query(sel("gpu_process_memory_bytes", GPU), "GPU {{gpu}} {{comm}} ({{pid}})")],
    )
