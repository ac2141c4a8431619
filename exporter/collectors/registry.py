"""The collector registry, node_exporter's way: each collector module registers itself with its name, its
default, its help and the flags of its own options; the ``--collector.NAME`` / ``--no-collector.NAME``
flags, the list of collectors that run and the ``collector`` label of the self-metrics all come from here.

A registration builds the collectors it stands for: GPU collectors (run on each GPU's worker thread) and
host collectors (run on the poller thread after every GPU was read), either list possibly empty (``xid``
is a thread of the poller's, not a collector that appends samples). No collector reads what another
emitted, so the order they run in decides nothing but the order of series in a scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..options import Option, parse_bool
from .base import GpuCollector, HostCollector

if TYPE_CHECKING:
    from ..config import ExporterConfig
    from .shared import Shared

# A registration's collectors, from the configuration and what collectors share (.shared.Shared).
GpuFactory = Callable[["ExporterConfig", "Shared"], Sequence[GpuCollector]]
HostFactory = Callable[["ExporterConfig", "Shared"], Sequence[HostCollector]]


@dataclass(frozen=True)
class Registration:
    """One collector as users switch it: ``--[no-]collector.NAME``, on or off by ``default``."""

    name: str
    help: str
    default: bool = True
    gpu: GpuFactory | None = None
    host: HostFactory | None = None
    options: tuple[Option, ...] = ()  # the flags of its own settings
    aliases: tuple[str, ...] = ()  # older spellings of its flag

    @property
    def switch(self) -> Option:
        """Its ``--collector.NAME`` flag."""
        return Option(
            f"--collector.{self.name}",
            self.name,
            parse_bool,
            "true" if self.default else "false",
            self.help,
            "collector",
            default_help="on" if self.default else "off",
            aliases=self.aliases,
        )


#: Every collector by name, in the order they registered (the order they run in).
REGISTRY: dict[str, Registration] = {}


def register(registration: Registration) -> Registration:
    """Add a collector to :data:`REGISTRY`; called once by each collector module at import."""
    if registration.name in REGISTRY:
        raise ValueError(f"collector {registration.name!r} registered twice")
    REGISTRY[registration.name] = registration
    return registration


def default_collectors() -> frozenset[str]:
    """The names of the collectors that run unless switched off."""
    return frozenset(name for name, registration in REGISTRY.items() if registration.default)
