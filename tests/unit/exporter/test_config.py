"""Flags and their environment variables: precedence, parsing, and one-line errors on bad values."""

from __future__ import annotations

import pytest

from inferwatch.exporter.collectors import REGISTRY
from inferwatch.exporter.config import build_parser, options, parse_config, parse_duration
from inferwatch.exporter.errors import ConfigError


def test_defaults() -> None:
    config = parse_config([], {})
    assert (config.listen_host, config.listen_port, config.telemetry_path) == ("", 8798, "/metrics")
    assert config.interval == config.timeout == 1.0
    assert [config.enabled(c) for c in ("pcie_throughput", "processes", "xid", "host")] == [
        False,
        True,
        True,
        True,
    ]
    processes, gpm, kubernetes = (config.collector_settings[c] for c in ("processes", "gpm", "kubernetes"))
    assert config.gpus == () and processes.max_processes == 16
    assert (config.enabled("gpm"), gpm.window) == (True, 1.0)
    assert config.enabled("kubernetes") and kubernetes.socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert kubernetes.resources == ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
    assert (kubernetes.timeout, kubernetes.interval) == (2.0, 10.0)


def test_a_flag_wins_over_its_variable_which_wins_over_the_default() -> None:
    env = {"INFERWATCH_EXPORTER_COLLECTOR_INTERVAL": "250ms", "INFERWATCH_EXPORTER_GPUS": "1,GPU-abc"}
    config = parse_config(["--collector.interval", "2s"], env)
    assert config.interval == 2.0
    assert config.timeout == 2.0  # follows the interval unless set
    assert config.gpus == ("1", "GPU-abc")
    assert parse_config([], env).interval == 0.25


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        (["--web.listen-address", "[::1]:9000"], {}, "listen_host", "::1"),
        (["--web.listen-address", ":9000"], {}, "listen_port", 9000),
        (["--processes.pid-file", "a", "--processes.pid-file", "b"], {}, "processes.pid_files", ("a", "b")),
        ([], {"INFERWATCH_EXPORTER_PROCESSES_PID_FILE": "a,b"}, "processes.pid_files", ("a", "b")),
        (["--collector.timeout", "300ms"], {}, "timeout", 0.3),
        (["--log.level", "warn"], {}, "log_level", "warning"),
        (["--gpus", "all"], {}, "gpus", ()),
        (["--collector.gpm.window", "250ms"], {}, "gpm.window", 0.25),
        ([], {"INFERWATCH_EXPORTER_COLLECTOR_GPM_WINDOW": "100ms"}, "gpm.window", 0.1),
        (
            [],
            {"INFERWATCH_EXPORTER_KUBERNETES_POD_RESOURCES_SOCKET": "/k.sock"},
            "kubernetes.socket",
            "/k.sock",
        ),
        (
            ["--kubernetes.resources", "nvidia.com/gpu, example.com/vgpu-*"],
            {},
            "kubernetes.resources",
            ("nvidia.com/gpu", "example.com/vgpu-*"),
        ),
        (["--kubernetes.timeout=500ms"], {}, "kubernetes.timeout", 0.5),
        ([], {"INFERWATCH_EXPORTER_KUBERNETES_INTERVAL": "1m"}, "kubernetes.interval", 60),
    ],
)
def test_values(argv: list[str], env: dict[str, str], field: str, expected: object) -> None:
    """``field``: of the configuration, or ``COLLECTOR.FIELD`` of a collector's settings."""
    config = parse_config(argv, env)
    collector, _, name = field.rpartition(".")
    assert getattr(config.collector_settings[collector] if collector else config, name) == expected


@pytest.mark.parametrize(
    ("argv", "env", "collector", "expected"),
    [
        (["--no-collector.host"], {"INFERWATCH_EXPORTER_COLLECTOR_HOST": "true"}, "host", False),
        ([], {"INFERWATCH_EXPORTER_COLLECTOR_PCIE_THROUGHPUT": "yes"}, "pcie_throughput", True),
        ([], {"INFERWATCH_EXPORTER_COLLECTOR_XID": "0"}, "xid", False),
        (["--no-collector.gpm"], {}, "gpm", False),
        (["--no-collector.kubernetes"], {}, "kubernetes", False),
        # node_exporter's spelling, and the older one with a dash, of the same switch.
        (["--collector.pcie_throughput"], {}, "pcie_throughput", True),
        (["--collector.pcie-throughput"], {}, "pcie_throughput", True),
        (["--no-collector.nvlink"], {}, "nvlink", False),
        ([], {"INFERWATCH_EXPORTER_COLLECTOR_CLOCKS_EVENTS": "off"}, "clocks_events", False),
    ],
)
def test_collector_switches(argv: list[str], env: dict[str, str], collector: str, expected: bool) -> None:
    assert parse_config(argv, env).enabled(collector) is expected


def test_every_registered_collector_has_its_switch_and_its_default() -> None:
    config = parse_config([], {})
    for name, registration in REGISTRY.items():
        assert config.enabled(name) is registration.default
        assert parse_config([f"--no-collector.{name}"], {}).enabled(name) is False
        assert parse_config([f"--collector.{name}"], {}).enabled(name) is True


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--collector.interval=0"], {}, "--collector.interval: '0' must be above zero"),
        (["--collector.interval=-1s"], {}, "--collector.interval: '-1s' is not a duration"),
        (
            [],
            {"INFERWATCH_EXPORTER_COLLECTOR_INTERVAL": "0s"},
            "INFERWATCH_EXPORTER_COLLECTOR_INTERVAL: '0s'",
        ),
        (["--web.listen-address", "8798"], {}, "is not HOST:PORT"),
        (["--web.listen-address", "::1:8798"], {}, "in brackets"),
        (["--web.telemetry-path", "/-/ready"], {}, "--web.telemetry-path"),
        (["--gpus", "first"], {}, "--gpus: 'first' is not 'all'"),
        # Values that cannot be meant: an empty item, a GPU twice, a path no scraper can ask for.
        ([], {"INFERWATCH_EXPORTER_GPUS": "0,,1"}, "INFERWATCH_EXPORTER_GPUS: '0,,1' .*: an empty item"),
        (["--gpus=0,0"], {}, "--gpus: '0,0' names 0 more than once"),
        (["--web.telemetry-path=/a b"], {}, "--web.telemetry-path: '/a b' has characters a URL path"),
        (["--web.telemetry-path=/m#x"], {}, "--web.telemetry-path: '/m#x' has characters"),
        ([], {"INFERWATCH_EXPORTER_NVML_MODULE": ""}, "INFERWATCH_EXPORTER_NVML_MODULE: '' is not a module"),
        ([], {"INFERWATCH_EXPORTER_NVML_MODULE": ".x"}, "INFERWATCH_EXPORTER_NVML_MODULE: '.x' is not"),
        (["--processes.name-pattern", "("], {}, "is not a regular expression"),
        (["--log.level", "loud"], {}, "--log.level"),
        ([], {"INFERWATCH_EXPORTER_COLLECTOR_HOST": "maybe"}, "INFERWATCH_EXPORTER_COLLECTOR_HOST: 'maybe'"),
        (["--collector.nonesuch"], {}, "unrecognized arguments: --collector.nonesuch"),
        # Sane limits: 1 ms polls burn a core, 99999999999h overflows the waits it becomes.
        (["--collector.interval=1ms"], {}, "--collector.interval: '1ms' is outside 100ms to 1h"),
        (["--collector.interval=99999999999h"], {}, "'99999999999h' is outside 100ms to 1h"),
        (["--collector.interval=2h"], {}, "--collector.interval: '2h' is outside"),
        (["--collector.timeout=50ms"], {}, "--collector.timeout: '50ms' is outside 100ms to 5m"),
        (["--collector.timeout=1h"], {}, "--collector.timeout: '1h' is outside"),
        ([], {"INFERWATCH_EXPORTER_NVML_RETRY_INTERVAL": "10ms"}, "INFERWATCH_EXPORTER_NVML_RETRY_INTERVAL"),
        (
            ["--collector.gpm.window=50ms"],
            {},
            "--collector.gpm.window: '50ms' is shorter than 100ms, NVML's minimum for GPM",
        ),
        (["--kubernetes.resources="], {}, "--kubernetes.resources: '' is not a list of resource names"),
        (["--kubernetes.resources=GPU!"], {}, "--kubernetes.resources: 'GPU!'"),
        (["--kubernetes.timeout=2m"], {}, "--kubernetes.timeout: '2m' is outside 100ms to 1m"),
        (["--kubernetes.interval=100ms"], {}, "--kubernetes.interval: '100ms' is outside 1s to 1h"),
    ],
)
def test_bad_values_raise_a_usage_error_naming_the_source(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match="^.*" + message.replace("(", r"\(").replace("[", r"\[")) as caught:
        parse_config(argv, env)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "interval", "timeout"),
    [
        (["--collector.interval=100ms"], 0.1, 0.1),
        (["--collector.interval=1h"], 3600, 300),  # the timeout follows the interval up to its own limit
        (["--collector.interval=1h", "--collector.timeout=5m"], 3600, 300),
        (["--collector.interval=200ms", "--collector.timeout=100ms"], 0.2, 0.1),
    ],
)
def test_the_limits_themselves_are_accepted(argv: list[str], interval: float, timeout: float) -> None:
    config = parse_config(argv, {})
    assert (config.interval, config.timeout) == (interval, timeout)


def test_version_only() -> None:
    assert parse_config(["--version"], {}) is None


def test_every_option_has_its_variable_in_the_help() -> None:
    help_text = " ".join(build_parser().format_help().split())
    for option in options():
        assert option.flag in help_text
        assert option.env in help_text


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("1.5s", 1.5), ("2m", 120), ("1h", 3600), ("3", 3)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
