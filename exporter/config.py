"""Command-line flags, in the style of Prometheus exporters, each with an environment variable.

A flag wins over its environment variable, which wins over the default. The variable's name is the
flag's, upper-cased, with dots and dashes as underscores, after ``INFERWATCH_EXPORTER_``:
``--web.listen-address`` is ``INFERWATCH_EXPORTER_WEB_LISTEN_ADDRESS``. Boolean variables take
true/false, 1/0, yes/no or on/off; list variables take commas. Every value is checked before anything
starts, and a bad one stops the exporter with one line naming the flag or variable, and exit status 2.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferwatch.common.durations import parse_duration

from .errors import ConfigError
from .nvml import DEFAULT_NVML_MODULE, GPM_MIN_SECONDS, NVML_MODULE_ENV

PROG = "inferwatch-exporter"
ENV_PREFIX = "INFERWATCH_EXPORTER_"
#: Not 9835 (nvidia_gpu_exporter), 9400 (dcgm-exporter) nor any port of Prometheus' default port
#: allocations; next to the serving endpoint's 8797 (docs/exporter.md, "Default port").
DEFAULT_PORT = 8798
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: The extended resources of NVIDIA's device plugin: whole GPUs, their time-sliced replicas when renamed
#: (``renameByDefault``), and MIG devices (``nvidia.com/mig-1g.10gb``, shared or not).
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
HEALTH_PATHS = ("/-/healthy", "/-/ready")


@dataclass(frozen=True)
class ExporterConfig:
    """Everything the exporter was asked to do, checked."""

    listen_host: str = ""
    listen_port: int = DEFAULT_PORT
    telemetry_path: str = "/metrics"
    web_config_file: str = ""
    interval: float = 1.0
    timeout: float = 1.0
    pcie_throughput: bool = False
    gpm: bool = True
    gpm_window: float = 1.0
    processes: bool = True
    xid: bool = True
    host: bool = True
    gpus: tuple[str, ...] = ()
    processes_max: int = 16
    pid_files: tuple[str, ...] = ()
    name_pattern: re.Pattern[str] | None = None
    gpu_processes: bool = True
    nvml_retry_interval: float = 30.0
    kubernetes: bool = True
    kubernetes_socket: str = DEFAULT_SOCKET
    kubernetes_resources: tuple[str, ...] = DEFAULT_RESOURCES
    kubernetes_timeout: float = 2.0
    kubernetes_interval: float = 10.0
    log_level: str = "info"
    nvml_module: str = DEFAULT_NVML_MODULE

    @property
    def listen_address(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"


# --- value parsers: each raises ValueError with a message that reads well after "flag: " ---------------


def bounded_duration(low: str, high: str) -> Callable[[str], float]:
    """A parser of durations from ``low`` to ``high`` (both written as durations, and included).

    Outside sane limits a duration is a mistake, not a setting: a 1 ms poll interval burns a core and
    floods the log, and one of 99999999999h overflows the thread waits it becomes.
    """
    lowest, highest = parse_duration(low), parse_duration(high)

    def parse(value: str) -> float:
        seconds = parse_duration(value)
        if not lowest <= seconds <= highest:
            raise ValueError(f"{value!r} is outside {low} to {high}")
        return seconds

    return parse


MAX_TIMEOUT = "5m"
parse_interval = bounded_duration("100ms", "1h")
parse_timeout = bounded_duration("100ms", MAX_TIMEOUT)
parse_kubernetes_interval = bounded_duration("1s", "1h")
parse_kubernetes_timeout = bounded_duration("100ms", "1m")


def parse_optional_timeout(value: str) -> float | None:
    """A collection timeout, or None for an empty value (unset: the poll interval)."""
    return parse_timeout(value) if value.strip() else None


def parse_gpm_window(value: str) -> float:
    """A duration no shorter than NVML's minimum between two GPM samples."""
    seconds = parse_duration(value)
    if seconds < GPM_MIN_SECONDS:
        raise ValueError(f"{value!r} is shorter than {GPM_MIN_SECONDS * 1000:.0f}ms, NVML's minimum for GPM")
    return seconds


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


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


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


def parse_count(value: str) -> int:
    if not value.strip().isdigit():
        raise ValueError(f"{value!r} is not a whole number >= 0")
    return int(value)


def parse_pattern(value: str) -> re.Pattern[str] | None:
    if not value:
        return None
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a regular expression: {exc}") from None


def parse_log_level(value: str) -> str:
    level = value.strip().lower()
    level = "warning" if level == "warn" else level
    if level not in ("debug", "info", "warning", "error"):
        raise ValueError(f"{value!r} is not one of debug, info, warn, error")
    return level


def parse_path_list(value: str) -> tuple[str, ...]:
    return tuple(path for path in value.split(",") if path)


def parse_resources(value: str) -> tuple[str, ...]:
    """A comma-separated list of extended resource names, ``*`` and ``?`` matching any characters."""
    tokens = tuple(token.strip() for token in value.split(",") if token.strip())
    bad = [t for t in tokens if not re.fullmatch(r"[a-z0-9*?]([-a-z0-9.*?]*/)?[-a-zA-Z0-9._*?]+", t)]
    if bad or not tokens:
        raise ValueError(f"{value!r} is not a list of resource names such as nvidia.com/gpu,nvidia.com/mig-*")
    return tokens


@dataclass(frozen=True)
class Option:
    flag: str
    field: str
    parse: Callable[[str], Any]
    default: str
    help: str
    kind: str = "value"  # value | bool | append
    metavar: str | None = None
    default_help: str = ""  # how --help shows the default, where the raw default says little

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.flag.lstrip("-")).upper()


OPTIONS = (
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
        "--collector.pcie-throughput",
        "pcie_throughput",
        parse_bool,
        "false",
        "PCIe TX/RX throughput; each reading blocks ~20 ms per direction and GPU",
        "bool",
    ),
    Option(
        "--collector.gpm",
        "gpm",
        parse_bool,
        "true",
        "SM, tensor and DRAM activity (and PCIe, NVLink bytes/s) from NVML GPM, on GPUs that have it",
        "bool",
    ),
    Option(
        "--collector.gpm.window",
        "gpm_window",
        parse_gpm_window,
        "1s",
        "time between the two GPM samples each reading is a ratio over (at least 100ms)",
        metavar="DURATION",
    ),
    Option(
        "--collector.processes",
        "processes",
        parse_bool,
        "true",
        "per-process GPU memory and serving-process CPU, memory and threads",
        "bool",
    ),
    Option(
        "--collector.xid",
        "xid",
        parse_bool,
        "true",
        "XID error events (a thread waiting on NVML events)",
        "bool",
    ),
    Option("--collector.host", "host", parse_bool, "true", "host CPU time, memory and load", "bool"),
    Option(
        "--gpus",
        "gpus",
        parse_gpus,
        "all",
        "GPUs to export: all, or indices and UUIDs, comma-separated",
        metavar="LIST",
    ),
    Option(
        "--processes.max",
        "processes_max",
        parse_count,
        "16",
        "most processes with series: per GPU for GPU memory, in total for serving processes",
        metavar="N",
    ),
    Option(
        "--processes.pid-file",
        "pid_files",
        parse_path_list,
        "",
        "file holding a serving process's PID (repeatable; the variable takes commas)",
        "append",
        metavar="PATH",
    ),
    Option(
        "--processes.name-pattern",
        "name_pattern",
        parse_pattern,
        "",
        "regular expression searched in process names (comm) to find serving processes",
        metavar="REGEX",
    ),
    Option(
        "--processes.gpu",
        "gpu_processes",
        parse_bool,
        "true",
        "count processes that NVML reports on the GPUs as serving processes",
        "bool",
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
        "--collector.kubernetes",
        "kubernetes",
        parse_bool,
        "true",
        "pods and containers holding each GPU (the kubelet's PodResources API) and the pod of each process",
        "bool",
    ),
    Option(
        "--kubernetes.pod-resources-socket",
        "kubernetes_socket",
        str,
        DEFAULT_SOCKET,
        "the kubelet's PodResources socket; none there means no pod series",
        metavar="PATH",
    ),
    Option(
        "--kubernetes.resources",
        "kubernetes_resources",
        parse_resources,
        ",".join(DEFAULT_RESOURCES),
        "extended resources that are GPUs, comma-separated; * matches any characters",
        metavar="LIST",
    ),
    Option(
        "--kubernetes.timeout",
        "kubernetes_timeout",
        parse_kubernetes_timeout,
        "2s",
        "how long one List of the PodResources API may take (100ms to 1m)",
        metavar="DURATION",
    ),
    Option(
        "--kubernetes.interval",
        "kubernetes_interval",
        parse_kubernetes_interval,
        "10s",
        "how often to List the PodResources API (1s to 1h)",
        metavar="DURATION",
    ),
    Option(
        "--log.level", "log_level", parse_log_level, "info", "debug, info, warn or error", metavar="LEVEL"
    ),
)

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
    for option in OPTIONS:
        default = option.default_help or option.default or "none"
        help_ = f"{option.help} [env {option.env}; default {default}]"
        if option.kind == "bool":
            parser.add_argument(
                option.flag,
                dest=option.field,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.field,
                action="append" if option.kind == "append" else "store",
                type=_for_argparse(option.parse),
                default=None,
                metavar=option.metavar or option.field.upper(),
                help=help_,
            )
    return parser


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
    for option in OPTIONS:
        given = getattr(args, option.field)
        if option.kind == "append" and given is not None:
            given = tuple(path for paths in given for path in paths)
        if given is None:
            raw = environ.get(option.env, option.default)
            try:
                given = option.parse(raw)
            except ValueError as exc:
                source = option.env if option.env in environ else option.flag
                raise ConfigError(f"{source}: {exc}") from None
        values[option.field] = given
    host, port = values.pop("listen_address")
    if values["timeout"] is None:
        values["timeout"] = min(values["interval"], parse_duration(MAX_TIMEOUT))
    nvml_module = environ.get(NVML_MODULE_ENV, DEFAULT_NVML_MODULE)
    if not _MODULE_NAME.fullmatch(nvml_module):
        raise ConfigError(
            f"{NVML_MODULE_ENV}: {nvml_module!r} is not a module name (unset it for {DEFAULT_NVML_MODULE})"
        )
    return ExporterConfig(listen_host=host, listen_port=port, nvml_module=nvml_module, **values)
