"""What the poller hands to collectors, and what it expects of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from inferwatch.common.clock import SYSTEM_CLOCK, Clock

from ..samples import FamilySpec, Sample

if TYPE_CHECKING:
    from ..nvml import GpuContext


class Configuration(Protocol):
    """What collectors read of the exporter's configuration besides their own settings, which their factories
    are handed (:mod:`.registry`). :class:`~inferwatch.exporter.config.ExporterConfig` is one; it is spelled
    out here because the collectors never import the configuration: the configuration imports them, when
    it gathers their options."""

    @property
    def interval(self) -> float: ...

    @property
    def collector_settings(self) -> Mapping[str, Any]: ...

    def enabled(self, collector: str) -> bool: ...


class GpuCollector(Protocol):
    name: str

    def collect(self, gpu: GpuContext) -> None: ...


class HostContext:
    """One collection of the host: where host collectors put samples, the processes seen on GPUs (PID ->
    UUIDs of the GPUs it runs on), and the clock of the poller."""

    def __init__(self, gpu_processes: dict[int, set[str]], clock: Clock = SYSTEM_CLOCK) -> None:
        self.samples: list[Sample] = []
        self.clock = clock
        self.gpu_processes = gpu_processes

    def emit(self, spec: FamilySpec, value: float, *labels: str) -> None:
        self.samples.append(Sample(spec, labels, float(value)))


class HostCollector(Protocol):
    name: str

    def collect(self, host: HostContext) -> None: ...
