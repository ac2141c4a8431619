"""What the collectors of two registrations share, made once by the poller and handed to the factories
of the registry: the kubelet's latest answer and the containers each GPU's collection found holding it
(with ``--collector.kubernetes``), and the choice of serving processes (with ``--collector.processes``).
Each is a state of its own, not a collector's output: whichever collector comes first fills it."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Configuration
from .kubernetes import PodAttribution
from .processes import ServingProcesses


@dataclass(frozen=True)
class Shared:
    pods: PodAttribution | None = None
    serving: ServingProcesses | None = None

    @classmethod
    def from_config(cls, config: Configuration) -> Shared:
        """Each made from the settings of the collector whose switch it comes with."""
        settings = config.collector_settings
        return cls(
            PodAttribution.from_settings(settings["kubernetes"]) if config.enabled("kubernetes") else None,
            ServingProcesses.from_settings(settings["processes"]) if config.enabled("processes") else None,
        )
