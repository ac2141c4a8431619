"""``inferwatch alerts``: write the bundled rules, or render them from a configuration.

* ``inferwatch alerts export DIR`` writes rules.yaml, config.yaml (the defaults, to copy and edit) and
  the promtool unit tests (tests/*.yaml, which read ../rules.yaml) into DIR.
* ``inferwatch alerts render [--config FILE] --out DIR`` merges FILE over the defaults, validates it and
  writes DIR/rules.yaml. A bad configuration exits with status 2 and names the key.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inferwatch.common.files import WriteError, write_files

from .config import ConfigError
from .render import bundled_files, render_to

#: Exceptions of ``main`` that mean bad configuration or an output directory that cannot be written: the
#: ``inferwatch`` dispatcher prints them in one line and exits with status 2.
USAGE_ERRORS = (ConfigError, WriteError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write the bundled rules, defaults and promtool tests to DIR")
    export.add_argument("dir", type=Path, metavar="DIR")
    render = actions.add_parser("render", help="render rules.yaml from a configuration file into DIR")
    render.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML merged over the defaults (alerts/config.yaml)"
    )
    render.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write rules.yaml")


def main(args: argparse.Namespace) -> int:
    if args.action == "export":
        for path in write_files(bundled_files(), args.dir):
            print(path)
        return 0
    print(render_to(args.out, args.config))
    return 0
