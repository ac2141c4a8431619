"""Command-line flags, in the style of Prometheus exporters, each with an environment variable.

A flag wins over its environment variable, which wins over the default. The variable's name is the
flag's, upper-cased, with dots and dashes as underscores, after ``INFERWATCH_EXPORTER_``:
``--web.listen-address`` is ``INFERWATCH_EXPORTER_WEB_LISTEN_ADDRESS``. Boolean variables take
true/false, 1/0, yes/no or on/off; list variables take commas. Every value is checked before anything
starts, and a bad one stops the exporter with one line naming the flag or variable, and exit status 2.

The flags here are the exporter's own (:data:`GENERAL_OPTIONS`, into :class:`ExporterConfig`); each
collector's switch and options, with their defaults and parsers, live in the collector's module, and make
its settings object (:mod:`.collectors.registry`). :func:`options` gathers them all by importing the
collectors package when called: this module never imports the collectors at its own import, and the
collectors never import it (they read it through :class:`.collectors.base.Configuration`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

from inferwatch.common.durations import parse_duration

from .errors import ConfigError
from .nvml import DEFAULT_NVML_MODULE, NVML_MODULE_ENV
from .options import ENV_PREFIX, Option, bounded_duration

PROG = "inferwatch-exporter"
#: Not 9835 (nvidia_gpu_exporter), 9400 (dcgm-exporter) nor any port of Prometheus' default port
#: allocations; next to the serving endpoint's 8797 (docs/exporter.md, "Default port").
DEFAULT_PORT = 8798
HEALTH_PATHS = ("/-/healthy", "/-/ready")


def _collectors() -> ModuleType:
    """The collectors package, whose import imports (and so registers) every collector.

    Imported here, when first called, never at this module's import: the configuration gathers the
    collectors' options from the package that registers them all, not from a registry that some other
    import happened to fill, and the collectors, which never import the configuration, form no cycle
    with it."""
    from . import collectors

    return collectors


def _default_collectors() -> frozenset[str]:
    return _collectors().default_collectors()


def _default_settings() -> Mapping[str, Any]:
    return _collectors().default_settings()


@dataclass(frozen=True)
class ExporterConfig:
    """Everything the exporter was asked to do, checked: its general settings, which collectors run, and
    the settings of each collector that has options (declared in its module, not here)."""

    listen_host: str = ""
    listen_port: int = DEFAULT_PORT
    telemetry_path: str = "/metrics"
    web_config_file: str = ""
    interval: float = 1.0
    timeout: float = 1.0
    #: The names of the collectors that run (:data:`.collectors.registry.REGISTRY`).
    collectors: frozenset[str] = dataclasses.field(default_factory=_default_collectors)
    gpus: tuple[str, ...] = ()
    nvml_retry_interval: float = 30.0
    log_level: str = "info"
    #: Where counts that must outlive the process are kept (XIDs); empty: nowhere.
    state_dir: str = ""
    nvml_module: str = DEFAULT_NVML_MODULE
    #: Collector name -> its settings (the frozen dataclass its module declares, made from its options),
    #: for each collector that has options; what its factories are handed when it is built.
    collector_settings: Mapping[str, Any] = dataclasses.field(default_factory=_default_settings, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "collector_settings", MappingProxyType(dict(self.collector_settings)))

    @property
    def listen_address(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"

    def enabled(self, collector: str) -> bool:
        """Whether the collector registered as ``collector`` runs."""
        return collector in self.collectors

    def switched(self, **collectors: bool) -> ExporterConfig:
        """This configuration with the named collectors switched on (True) or off (False)."""
        unknown = set(collectors) - set(_collectors().REGISTRY)
        if unknown:
            raise ValueError(f"no such collector: {', '.join(sorted(unknown))}")
        on = {name for name, wanted in collectors.items() if wanted}
        return dataclasses.replace(self, collectors=(self.collectors - set(collectors)) | on)

    def with_settings(self, collector: str, **changes: Any) -> ExporterConfig:
        """This configuration with fields of ``collector``'s settings changed: ``with_settings("gpm",
        window=0.5)``."""
        if collector not in self.collector_settings:
            raise ValueError(f"collector {collector!r} has no settings")
        changed = dataclasses.replace(self.collector_settings[collector], **changes)
        return dataclasses.replace(self, collector_settings={**self.collector_settings, collector: changed})


# --- value parsers: each raises ValueError with a message that reads well after "flag: " ---------------

MAX_TIMEOUT = "5m"
parse_interval = bounded_duration("100ms", "1h")
parse_timeout = bounded_duration("100ms", MAX_TIMEOUT)


def parse_optional_timeout(value: str) -> float | None:
    """A collection timeout, or None for an empty value (unset: the poll interval)."""
    return parse_timeout(value) if value.strip() else None


def parse_listen_address(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all interfaces) or ``[IPV6]:PORT``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT with a port from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 host in brackets, e.g. [::1]:{port}")
    return host, int(port)


# RFC 3986 path characters (pchar and "/"): a space, "?" or "#" cannot be in the path a scraper asks for.
_URL_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")
# A Python module name, dotted: what importlib can import without a package to be relative to.
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def parse_telemetry_path(value: str) -> str:
    if not value.startswith("/") or value in HEALTH_PATHS or value == "/":
        raise ValueError(f"{value!r} must be a path starting with / other than /, {', '.join(HEALTH_PATHS)}")
    if not _URL_PATH.fullmatch(value):
        raise ValueError(f"{value!r} has characters a URL path cannot hold (a space, ?, #...)")
    return value


def parse_gpus(value: str) -> tuple[str, ...]:
    """``all`` or a comma-separated list of indices and UUIDs (``GPU-...``)."""
    if value.strip().lower() == "all":
        return ()
    tokens = tuple(token.strip() for token in value.split(","))
    bad = [t for t in tokens if not (t.isdigit() or t.startswith("GPU-"))]
    if bad:
        what = "an empty item" if "" in bad else f"{bad[0]!r}"
        raise ValueError(f"{value!r} is not 'all' or a list of GPU indices and UUIDs (GPU-...): {what}")
    twice = sorted({t for t in tokens if tokens.count(t) > 1})
    if twice:
        raise ValueError(f"{value!r} names {', '.join(twice)} more than once")
    return tokens


def parse_log_level(value: str) -> str:
    level = value.strip().lower()
    level = "warning" if level == "warn" else level
    if level not in ("debug", "info", "warning", "error"):
        raise ValueError(f"{value!r} is not one of debug, info, warn, error")
    return level


#: The exporter's own flags, into :class:`ExporterConfig`; :func:`options` adds the collectors'.
GENERAL_OPTIONS = (
    Option(
        "--web.listen-address",
        "listen_address",
        parse_listen_address,
        f":{DEFAULT_PORT}",
        "address to serve metrics on: HOST:PORT, :PORT for all interfaces, [IPV6]:PORT",
        metavar="HOST:PORT",
    ),
    Option(
        "--web.telemetry-path",
        "telemetry_path",
        parse_telemetry_path,
        "/metrics",
        "path of the metrics",
        metavar="PATH",
    ),
    Option(
        "--web.config.file",
        "web_config_file",
        str,
        "",
        "web configuration file for TLS and basic auth, in the Prometheus exporter-toolkit format",
        metavar="PATH",
    ),
    Option(
        "--collector.interval",
        "interval",
        parse_interval,
        "1s",
        "how often to poll NVML and the host (100ms to 1h)",
        metavar="DURATION",
    ),
    Option(
        "--collector.timeout",
        "timeout",
        parse_optional_timeout,
        "",
        "how long one NVML call may run before its GPU is served as down, hung (100ms to 5m)",
        metavar="DURATION",
        default_help=f"the poll interval, at most {MAX_TIMEOUT}",
    ),
    Option(
        "--gpus",
        "gpus",
        parse_gpus,
        "all",
        "GPUs to export: all, or indices and UUIDs, comma-separated",
        metavar="LIST",
    ),
    Option(
        "--nvml.retry-interval",
        "nvml_retry_interval",
        parse_interval,
        "30s",
        "how often to retry initialising NVML while it is unavailable (100ms to 1h)",
        metavar="DURATION",
    ),
    Option(
        "--state.dir",
        "state_dir",
        str,
        "",
        "directory where XID counts are kept across restarts of the exporter (written at every XID)",
        metavar="PATH",
    ),
    Option(
        "--log.level", "log_level", parse_log_level, "info", "debug, info, warn or error", metavar="LEVEL"
    ),
)


def _owned_options() -> list[tuple[str | None, Option]]:
    """Every flag with its owner: None for the exporter's own, else the collector's name (its switch, then
    its options), collectors in the order they run."""
    owned: list[tuple[str | None, Option]] = [(None, option) for option in GENERAL_OPTIONS]
    for name, registration in _collectors().REGISTRY.items():
        owned += [(name, option) for option in (registration.switch, *registration.options)]
    return owned


def options() -> tuple[Option, ...]:
    """Every flag, as ``--help`` lists them: the exporter's own, then each collector's switch and options."""
    return tuple(option for _, option in _owned_options())


_EPILOG = f"""\
Every flag has an environment variable, shown after it: {ENV_PREFIX} and the flag's name
in capitals, dots and dashes as underscores. A flag wins over its variable.
{NVML_MODULE_ENV} names the NVML binding module (default {DEFAULT_NVML_MODULE});
the tests use it to load a fault-injecting stand-in.

Endpoints: the telemetry path; /-/healthy (200 while the process serves); /-/ready (200 once a
collection has finished). Exit status 2 on bad configuration: a bad value, an unusable web config
file, an address that cannot be listened on.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Prometheus exporter for NVIDIA GPUs (NVML), the host and LLM serving processes.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    for owner, option in _owned_options():
        default = option.default_help or option.default or "none"
        help_ = f"{option.help} [env {option.env}; default {default}]"
        if option.kind in ("bool", "collector"):
            parser.add_argument(
                option.flag,
                *option.aliases,
                dest=_dest(owner, option),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=_dest(owner, option),
                action="append" if option.kind == "append" else "store",
                type=_for_argparse(option.parse),
                default=None,
                metavar=option.metavar or option.field.upper(),
                help=help_,
            )
    return parser


def _dest(owner: str | None, option: Option) -> str:
    """Where argparse puts the value: a collector's switch and options apart from the general fields (the
    Kubernetes collector's ``timeout`` is not the exporter's)."""
    if option.kind == "collector":
        return f"collector.{option.field}"
    return option.field if owner is None else f"{owner}.{option.field}"


def _for_argparse(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> ExporterConfig | None:
    """The configuration from ``argv`` and ``environ``; None when only ``--version`` was asked.

    Raises :class:`.errors.ConfigError` (a ``ValueError``) on any bad value.
    """
    args = build_parser().parse_args(argv)
    if args.version:
        return None
    values: dict[str, Any] = {}
    collectors: set[str] = set()
    collector_values: dict[str, dict[str, Any]] = {}
    for owner, option in _owned_options():
        given = getattr(args, _dest(owner, option))
        if option.kind == "append" and given is not None:
            given = tuple(path for paths in given for path in paths)
        if given is None:
            raw = environ.get(option.env, option.default)
            try:
                given = option.parse(raw)
            except ValueError as exc:
                source = option.env if option.env in environ else option.flag
                raise ConfigError(f"{source}: {exc}") from None
        if option.kind == "collector":
            collectors.update([option.field] if given else [])
        elif owner is None:
            values[option.field] = given
        else:
            collector_values.setdefault(owner, {})[option.field] = given
    host, port = values.pop("listen_address")
    if values["timeout"] is None:
        values["timeout"] = min(values["interval"], parse_duration(MAX_TIMEOUT))
    nvml_module = environ.get(NVML_MODULE_ENV, DEFAULT_NVML_MODULE)
    if not _MODULE_NAME.fullmatch(nvml_module):
        raise ConfigError(
            f"{NVML_MODULE_ENV}: {nvml_module!r} is not a module name (unset it for {DEFAULT_NVML_MODULE})"
        )
    registry = _collectors().REGISTRY
    return ExporterConfig(
        listen_host=host,
        listen_port=port,
        collectors=frozenset(collectors),
        nvml_module=nvml_module,
        collector_settings={
            name: registration.make_settings(collector_values.get(name, {}))
            for name, registration in registry.items()
            if registration.settings is not None
        },
        **values,
    )
