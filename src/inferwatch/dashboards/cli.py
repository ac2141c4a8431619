"""``inferwatch dashboards``: write the bundled Grafana dashboards, or regenerate them from the code.

* ``inferwatch dashboards export DIR`` writes the dashboards shipped with the package (JSON for
  Grafana's file provisioning or its import dialog); it needs nothing but the package.
* ``inferwatch dashboards generate --out DIR`` builds them from the generator code with
  grafana-foundation-sdk (the ``dashboards`` extra); ``--out dashboards`` refreshes the committed copies.
  ``--config FILE`` builds them from the alerts configuration that renders the rules (``inferwatch alerts
  render --config FILE``): its job selectors and thresholds, so dashboards and rules agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inferwatch.alerts.config import ConfigError, load_config
from inferwatch.common.files import WriteError, write_files

from .generate import bundled_files, generate

#: Exceptions of ``main`` that mean bad input: the ``inferwatch`` dispatcher prints them in one line and
#: exits with status 2.
USAGE_ERRORS = (WriteError, ConfigError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write the bundled dashboard JSON files to DIR")
    export.add_argument("dir", type=Path, metavar="DIR")
    build = actions.add_parser("generate", help="build the dashboards from the generator code into DIR")
    build.add_argument("--out", type=Path, required=True, metavar="DIR")
    build.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="alerts configuration merged over the defaults (selectors, thresholds), as for alerts render",
    )


def main(args: argparse.Namespace) -> int:
    files = bundled_files() if args.action == "export" else generate(load_config(args.config))
    target = args.dir if args.action == "export" else args.out
    for path in write_files(files, target):
        print(path)
    return 0
