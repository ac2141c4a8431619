"""The ``inferwatch`` command: a thin dispatcher over subcommands that live beside the code they drive.

Each subcommand module is imported only when it is invoked, so ``inferwatch top`` never imports torch and
``inferwatch demo`` never imports the dashboards SDK. A subcommand module provides two functions:

* ``add_arguments(parser: argparse.ArgumentParser) -> None``
* ``main(args: argparse.Namespace) -> int`` (the process exit code)

and may name, in ``USAGE_ERRORS``, the exceptions of ``main`` that mean bad configuration: ``ValueError``
or ``OSError`` subclasses defined with the code that raises them (e.g. ``ConfigError`` of its package, or
``ListenError`` for an address that cannot be listened on). The dispatcher prints such an exception in
one line (an ``OSError``'s ``strerror``) and exits with status 2, the convention of Prometheus exporters
and argparse, whose ``parser.error`` does the same for bad syntax. Nothing else catches them, so library
code never depends on this package.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order of `inferwatch --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "inferwatch.instrumentation.demo.command",
        "serve a small built-in model, instrumented, on localhost",
    ),
    "run": (
        "inferwatch.instrumentation.launcher.command",
        "run a program with every transformers model instrumented",
    ),
    "top": ("inferwatch.monitor.top", "live terminal view of inferwatch endpoints"),
    "diagnose": ("inferwatch.monitor.diagnose", "apply the bottleneck matrix to live metrics"),
    "profile": ("inferwatch.monitor.profile", "profile the next forward steps of a serving process"),
    "bench": ("inferwatch.bench.bench", "benchmark a model: TTFT, per-token latency, tokens/s"),
    "compare": ("inferwatch.bench.compare", "regression-test a candidate model against a baseline"),
    "dashboards": ("inferwatch.dashboards.cli", "export the bundled Grafana dashboards"),
    "alerts": ("inferwatch.alerts.cli", "export or render the bundled Prometheus rules"),
}


def _one_line(exc: BaseException) -> str:
    """The message of a usage error: an ``OSError``'s ``strerror`` (without the ``[Errno N]`` prefix)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _top_level_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: inferwatch COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `inferwatch COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``inferwatch`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_level_help())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"inferwatch: unknown command {name!r}\n\n{_top_level_help()}", file=sys.stderr)
        return 2
    module_name, help_ = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"inferwatch {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.main(args) or 0)
    except tuple(getattr(module, "USAGE_ERRORS", ())) as exc:
        print(f"inferwatch {name}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
