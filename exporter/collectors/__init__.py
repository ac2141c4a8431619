"""Collectors, one concern per module, each failing alone (node_exporter style).

A GPU collector reads one GPU through a :class:`~inferwatch.exporter.nvml.GpuContext` and runs on that
GPU's worker thread; a host collector reads the host through a :class:`.base.HostContext` on the poller
thread. Either kind only appends samples: if it raises, the poller drops what it appended in that
collection, counts the failure, and the other collectors' series are served as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import GpuCollector, HostCollector, HostContext
from .clocks import ClocksCollector
from .clocks_events import ClocksEventsCollector
from .ecc import EccCollector
from .gpm import GpmCollector
from .gpu_processes import GpuProcessesCollector
from .host import HostStatsCollector
from .identity import IdentityCollector
from .kubernetes import KubernetesPodsCollector, KubernetesProcessesCollector, PodAttribution
from .memory import MemoryCollector
from .mig import MigCollector
from .nvlink import NvlinkCollector
from .pcie import PcieCollector
from .pcie_throughput import PcieThroughputCollector
from .power import PowerCollector
from .processes import ProcessesCollector
from .thermal import ThermalCollector
from .utilization import UtilizationCollector

if TYPE_CHECKING:
    from ..config import ExporterConfig

__all__ = [
    "GpuCollector",
    "HostCollector",
    "HostContext",
    "PodAttribution",
    "gpu_collectors",
    "host_collectors",
]


def gpu_collectors(config: ExporterConfig, pods: PodAttribution | None = None) -> list[GpuCollector]:
    """The NVML collectors the configuration enables, in the order they run; ``pods`` (with
    ``--collector.kubernetes``) is what the Kubernetes collectors share."""
    collectors: list[GpuCollector] = [
        IdentityCollector(),
        UtilizationCollector(),
        MemoryCollector(),
        PowerCollector(),
        ThermalCollector(),
        ClocksCollector(),
        ClocksEventsCollector(),
        PcieCollector(),
        EccCollector(),
        NvlinkCollector(),
        MigCollector(),
    ]
    if config.gpm:  # before pcie_throughput, which skips the blocking reading where GPM had PCIe
        collectors.append(GpmCollector(config.gpm_window, config.interval))
    if config.processes:
        collectors.append(GpuProcessesCollector(config.processes_max))
    if config.pcie_throughput:
        collectors.append(PcieThroughputCollector())
    if pods is not None:
        collectors.append(KubernetesPodsCollector(pods))
    return collectors


def host_collectors(config: ExporterConfig, pods: PodAttribution | None = None) -> list[HostCollector]:
    """The psutil collectors the configuration enables, in the order they run."""
    collectors: list[HostCollector] = []
    if config.host:
        collectors.append(HostStatsCollector())
    if config.processes:
        collectors.append(
            ProcessesCollector(
                config.pid_files, config.name_pattern, config.gpu_processes, config.processes_max
            )
        )
        if pods is not None:  # after the serving processes, which it names too
            collectors.append(KubernetesProcessesCollector(pods, config.processes_max))
    return collectors
