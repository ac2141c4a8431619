"""The ``inferwatch`` command: a thin dispatcher over subcommands that live beside the code they drive.

Each subcommand module is imported only when it is invoked, so ``inferwatch top`` never imports torch and
``inferwatch demo`` never imports the dashboards SDK. A subcommand module provides two functions:

* ``add_arguments(parser: argparse.ArgumentParser) -> None``
* ``main(args: argparse.Namespace) -> int`` (the process exit code)

Bad configuration is reported by raising :class:`UsageError` (or via ``parser.error``): the dispatcher
prints the message and exits with status 2, the convention of Prometheus exporters and argparse.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order of `inferwatch --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("inferwatch.instrumentation.demo", "serve a small built-in model, instrumented, on localhost"),
    "run": (
        "inferwatch.instrumentation.launcher",
        "run a program with every transformers model instrumented",
    ),
    "top": ("inferwatch.monitor.top", "live terminal view of inferwatch endpoints"),
    "diagnose": ("inferwatch.monitor.diagnose", "apply the bottleneck matrix to live metrics"),
    "bench": ("inferwatch.bench.bench", "benchmark a model: TTFT, per-token latency, tokens/s"),
    "compare": ("inferwatch.bench.compare", "regression-test a candidate model against a baseline"),
    "dashboards": ("inferwatch.dashboards.cli", "export the bundled Grafana dashboards"),
    "alerts": ("inferwatch.alerts.cli", "export or render the bundled Prometheus rules"),
}


class UsageError(Exception):
    """Bad configuration given on the command line: reported in one line, exit status 2."""


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
    except UsageError as exc:
        print(f"inferwatch {name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
