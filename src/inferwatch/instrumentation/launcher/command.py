"""``inferwatch run [OPTIONS] -- PROGRAM [ARGS...]``: run a program with its transformers models instrumented.

In the spirit of ``opentelemetry-instrument``: the launcher validates its configuration, writes it into
the environment, puts a ``sitecustomize`` module of its own first on ``PYTHONPATH`` and replaces itself
with the program (``exec``: same process id, so exit status and signals are the program's own). Python
imports that ``sitecustomize`` at start-up in the program and in every Python process it starts; it
chains to any ``sitecustomize`` that was already on the path, starts the metrics endpoint and hooks
transformers so that every causal LM created afterwards is instrumented (see ``_autoinstrument``).

Every option has an environment variable, read when the option is not given; the program sees the
resulting values in those same variables.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import glob
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from inferwatch.common.webconfig import load_web_config
from inferwatch.instrumentation.config import ENV_PREFIX, ConfigError, InstrumentConfig
from inferwatch.instrumentation.edge.middleware import stop_setting_from_env
from inferwatch.instrumentation.endpoint.program import max_collection_from_env
from inferwatch.instrumentation.endpoint.server import (
    DEFAULT_ADDRESS,
    DEFAULT_PORT,
    MULTIPROC_DIR_ENV,
    WEB_CONFIG_ENV,
    ListenError,
    PortInUseError,
    helper_process_wanted,
    validate_port,
)
from inferwatch.instrumentation.profiling.captures import ProfileConfig

PORT_ENV = "INFERWATCH_PORT"
ADDRESS_ENV = "INFERWATCH_ADDR"
SERVE_ENV = "INFERWATCH_SERVE"
MODEL_NAME_ENV = "INFERWATCH_MODEL_NAME"
#: Set inside the program by the process that serves the metrics; the Python processes it starts inherit
#: it and do not compete for the port. Never passed on by the launcher: each launch serves anew.
SERVER_PID_ENV = "INFERWATCH_SERVER_PID"

#: The directory holding the launcher's ``sitecustomize.py``.
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class LaunchSettings:
    """What the launched program's bootstrap needs besides the instrumentation's own configuration."""

    port: int = DEFAULT_PORT
    address: str = DEFAULT_ADDRESS
    serve: bool = True
    model_name: str | None = None
    multiprocess_dir: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LaunchSettings:
        """Settings from the environment; ValueError naming the variable for a malformed value."""
        port = DEFAULT_PORT
        if PORT_ENV in environ:
            try:
                port = validate_port(int(environ[PORT_ENV]))
            except ValueError:
                raise ValueError(
                    f"{PORT_ENV} must be an integer in 0..65535, got {environ[PORT_ENV]!r}"
                ) from None
        serve = True
        if SERVE_ENV in environ:
            value = environ[SERVE_ENV].strip().lower()
            if value not in _TRUE | _FALSE:
                raise ValueError(f"{SERVE_ENV} must be 1 or 0, got {environ[SERVE_ENV]!r}")
            serve = value in _TRUE
        return cls(
            port=port,
            address=environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS,
            serve=serve,
            model_name=environ.get(MODEL_NAME_ENV) or None,
            multiprocess_dir=environ.get(MULTIPROC_DIR_ENV) or None,
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that give these settings to the launched program."""
        env = {PORT_ENV: str(self.port), ADDRESS_ENV: self.address, SERVE_ENV: "1" if self.serve else "0"}
        if self.model_name:
            env[MODEL_NAME_ENV] = self.model_name
        if self.multiprocess_dir:
            env[MULTIPROC_DIR_ENV] = self.multiprocess_dir
        return env


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError, ListenError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "inferwatch run [OPTIONS] -- PROGRAM [ARGS...]"
    parser.epilog = (
        "Example: inferwatch run --port 8799 -- python serve.py --workers 1. "
        "Metrics of every transformers causal LM the program creates (from_pretrained, from_config or "
        "direct construction) are served on http://ADDR:PORT/metrics."
    )
    parser.add_argument(
        "--port", type=int, help=f"metrics port, 0 for any free port (${PORT_ENV}, default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--addr", help=f"address the endpoint listens on (${ADDRESS_ENV}, default {DEFAULT_ADDRESS})"
    )
    parser.add_argument(
        "--no-server",
        action="store_true",
        help=f"instrument only; the program serves the metrics itself (${SERVE_ENV}=0)",
    )
    parser.add_argument(
        "--model-name",
        metavar="NAME",
        help=f"value of the `model` label (${MODEL_NAME_ENV}, default: from the model)",
    )
    parser.add_argument(
        "--multiprocess-dir",
        metavar="DIR",
        help=f"prometheus_client multiprocess mode for programs with worker processes: the directory "
        f"the workers write to, created if missing, stale *.db files removed (${MULTIPROC_DIR_ENV})",
    )
    _add_instrument_config_arguments(parser.add_argument_group("instrumentation (InstrumentConfig)"))
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments, after --")


def _config_option(field: dataclasses.Field) -> str:
    if field.type in (bool, "bool") and field.name.startswith("enable_"):
        return "--no-" + field.name.removeprefix("enable_").replace("_", "-")
    return "--" + field.name.replace("_", "-")


def _add_instrument_config_arguments(group: argparse._ArgumentGroup) -> None:
    """One option per InstrumentConfig field, so the launcher follows the configuration as it grows."""
    for field in dataclasses.fields(InstrumentConfig):
        variable = ENV_PREFIX + field.name.upper()
        option = _config_option(field)
        if option.startswith("--no-"):
            group.add_argument(
                option, dest=field.name, action="store_const", const="0", help=f"${variable}=0"
            )
        elif field.name.endswith("_buckets"):
            group.add_argument(
                option, dest=field.name, metavar="B1,B2,...", help=f"bucket bounds (${variable})"
            )
        else:
            group.add_argument(option, dest=field.name, metavar="VALUE", help=f"${variable}")


def _instrument_config_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The INFERWATCH_<FIELD> variables for the program: options over environment, validated."""
    env = {}
    for field in dataclasses.fields(InstrumentConfig):
        value = getattr(args, field.name, None)
        if value is None:
            continue
        variable = ENV_PREFIX + field.name.upper()
        try:
            InstrumentConfig.from_env({variable: value})
        except ValueError as exc:
            raise ConfigError(f"{_config_option(field)}: {exc}") from None
        env[variable] = value
    try:
        InstrumentConfig.from_env({**environ, **env})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return env


def resolve_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> LaunchSettings:
    """Options over environment over defaults, validated; ConfigError on bad configuration."""
    try:
        settings = LaunchSettings.from_env(environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.port is not None:
        try:
            validate_port(args.port)
        except ValueError as exc:
            raise ConfigError(f"--port: {exc}") from None
    multiprocess_dir = args.multiprocess_dir or settings.multiprocess_dir
    return LaunchSettings(
        port=settings.port if args.port is None else args.port,
        address=args.addr or settings.address,
        serve=settings.serve and not args.no_server,
        model_name=args.model_name or settings.model_name,
        multiprocess_dir=os.path.abspath(multiprocess_dir) if multiprocess_dir else None,
    )


def check_endpoint_environment(environ: Mapping[str, str], *, program: bool) -> None:
    """ConfigError for a web config, profiling or helper-process variable the metrics endpoint could not
    start with, and with ``program`` for one of what ``inferwatch run`` adds to the program (the middleware
    on transformers serve, the program's hub): ``inferwatch run`` and ``inferwatch demo`` say it in one
    line before anything starts."""
    try:
        ProfileConfig.from_env(environ)
        load_web_config(environ.get(WEB_CONFIG_ENV, ""))
        helper_process_wanted(environ)
        if program:
            stop_setting_from_env(environ)
            max_collection_from_env(environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_port_free(address: str, port: int) -> None:
    """Fail before the program starts when the endpoint could not listen.

    :class:`PortInUseError` for a taken port, :class:`ListenError` for an address that cannot be listened
    on (unknown, not local, not permitted); both name the address and port, as ``start_http_server`` does.
    """
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # The same option the endpoint's server sets, so a port in TIME_WAIT is not reported taken.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                exc.errno, f"cannot serve metrics on {address}:{port}: the address is already in use"
            ) from None
        raise ListenError(
            exc.errno, f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}"
        ) from None


def with_flag_hint(exc: ListenError, port_flag: str, address_flag: str) -> ListenError:
    """``exc`` (same class and errno) with the flag that changes the port, or the address, appended.

    The library's message names the address and port; a command adds how its user picks another one.
    """
    if isinstance(exc, PortInUseError):
        hint = f"pick another port with {port_flag}"
    else:
        hint = f"change {address_flag} or {port_flag}"
    return type(exc)(exc.errno, f"{exc.strerror}; {hint}")


def prepare_multiprocess_dir(path: str) -> None:
    """Create the directory and drop the files of a previous run: their counters would add up with ours."""
    try:
        os.makedirs(path, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
    except OSError as exc:
        raise ConfigError(f"--multiprocess-dir {path}: {exc.strerror or exc}") from None


def child_environment(
    settings: LaunchSettings, config_env: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The program's environment: ours, the settings, and the bootstrap directory first on PYTHONPATH."""
    env = {**environ, **config_env, **settings.to_env()}
    env.pop(SERVER_PID_ENV, None)
    python_path = [str(BOOTSTRAP_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(python_path))
    return env


def main(args: argparse.Namespace) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise ConfigError("no program given: inferwatch run [OPTIONS] -- PROGRAM [ARGS...]")
    settings = resolve_settings(args, os.environ)
    config_env = _instrument_config_environment(args, os.environ)
    check_endpoint_environment(os.environ, program=True)
    if settings.serve:
        try:
            check_port_free(settings.address, settings.port)
        except ListenError as exc:
            raise with_flag_hint(exc, f"--port (or ${PORT_ENV})", f"--addr (or ${ADDRESS_ENV})") from None
    if settings.multiprocess_dir:
        prepare_multiprocess_dir(settings.multiprocess_dir)
    env = child_environment(settings, config_env, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(program[0], program, env)
    except OSError as exc:
        # The exit statuses of env(1) and shells: 127 not found, 126 found but not runnable.
        print(f"inferwatch run: cannot run {program[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
