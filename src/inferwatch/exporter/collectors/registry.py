"""The collector registry, node_exporter's way: each collector module registers itself with its name, its
default, its help, the flags of its own options and the settings they make; the ``--collector.NAME`` /
``--no-collector.NAME`` flags, the list of collectors that run and the ``collector`` label of the
self-metrics all come from here.

A collector's options are its own: their flags, defaults and parsers live in its module, with the frozen
dataclass of its settings (one field per option, named by :attr:`~..options.Option.field`), and the
configuration (:mod:`..config`) keeps only what is general. Parsing gives each collector its settings
object (:attr:`~..config.ExporterConfig.collector_settings`), which its factories are handed.

A registration builds the collectors it stands for: GPU collectors (run on each GPU's worker thread) and
host collectors (run on the poller thread after every GPU was read), either list possibly empty (``xid``
is a thread of the poller's, not a collector that appends samples). No collector reads what another
emitted, so the order they run in decides nothing but the order of series in a scrape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import Option, parse_bool
from .base import Configuration, GpuCollector, HostCollector

if TYPE_CHECKING:
    from .shared import Shared

# A registration's collectors, from the general configuration, its own settings (None without options)
# and what collectors share (.shared.Shared).
GpuFactory = Callable[[Configuration, Any, "Shared"], Sequence[GpuCollector]]
HostFactory = Callable[[Configuration, Any, "Shared"], Sequence[HostCollector]]


@dataclass(frozen=True)
class Registration:
    """One collector as users switch it: ``--[no-]collector.NAME``, on or off by ``default``."""

    name: str
    help: str
    default: bool = True
    gpu: GpuFactory | None = None
    host: HostFactory | None = None
    options: tuple[Option, ...] = ()  # the flags of its own settings
    settings: type | None = None  # the frozen dataclass they make, a field per option; with options only
    aliases: tuple[str, ...] = ()  # older spellings of its flag

    def __post_init__(self) -> None:
        fields = {field.name for field in dataclasses.fields(self.settings)} if self.settings else set()
        named = [option.field for option in self.options]
        if sorted(named) != sorted(fields):
            raise ValueError(
                f"collector {self.name!r}: the fields of its options ({', '.join(named) or 'none'}) are not "
                f"those of its settings ({', '.join(sorted(fields)) or 'none'})"
            )

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

    def make_settings(self, values: Mapping[str, Any]) -> Any:
        """Its settings from the parsed values of its options, by field; None for one without options."""
        return None if self.settings is None else self.settings(**values)

    def default_settings(self) -> Any:
        """Its settings with every option at its default: the defaults are the options', not repeated."""
        return self.make_settings({option.field: option.parse(option.default) for option in self.options})


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


def default_settings() -> dict[str, Any]:
    """The settings of each collector that has options, by name, every option at its default."""
    return {
        name: registration.default_settings()
        for name, registration in REGISTRY.items()
        if registration.settings is not None
    }
