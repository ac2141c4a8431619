"""What the collectors of two registrations share, made once by the poller and handed to the factories
of the registry: the kubelet's latest answer and the containers each GPU's collection found holding it
(with ``--collector.kubernetes``), and the choice of serving processes (with ``--collector.processes``).
Each is a state of its own, not a collector's output: whichever collector comes first fills it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .kubernetes import PodAttribution
from .processes import ServingProcesses

if TYPE_CHECKING:
    from ..config import ExporterConfig


@dataclass(frozen=True)
class Shared:
    pods: PodAttribution | None = None
    serving: ServingProcesses | None = None

    @classmethod
    def from_config(cls, config: ExporterConfig) -> Shared:
        return cls(
            PodAttribution.from_config(config) if config.enabled("kubernetes") else None,
            ServingProcesses.from_config(config) if config.enabled("processes") else None,
        )
