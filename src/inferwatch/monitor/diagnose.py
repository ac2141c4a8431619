"""``inferwatch diagnose``: the reference notes' bottleneck matrix and fault list, applied to live metrics.

Two sources of data, the same checks (:mod:`inferwatch.monitor.checks`):

* ``--prometheus URL``: range queries over the last ``--window`` at ``--step`` resolution, rates over
  ``--rate-window``, from a Prometheus server that scrapes the exporter and the serving processes;
* ``--endpoint URL`` (repeatable): the endpoints themselves, scraped ``--samples`` times ``--interval``
  seconds apart; each pair of consecutive scrapes is one step.

The checks judge by the alert configuration's thresholds (:mod:`inferwatch.monitor.checks.thresholds`):
the bundled defaults, or ``--alerts-config FILE`` merged over them, so a diagnosis agrees with the alerts.

Exit status: 0 when nothing is alarming (no finding, or only informational ones), 1 when there are
warning or critical findings, 2 for bad options, 3 when the data could not be read or held nothing any
check could judge.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.alerts.config import ConfigError as AlertsConfigError
from inferwatch.alerts.config import load_config
from inferwatch.common.durations import parse_duration
from inferwatch.monitor.checks import Diagnosis, Series, Severity, Thresholds, diagnose
from inferwatch.monitor.expr import Expr
from inferwatch.monitor.prometheus import PrometheusClient, PrometheusError
from inferwatch.monitor.scrape import Snapshot, normalize_url, scrape_round

from .errors import ConfigError
from .profile import ProfileClient, ProfileError, auth_headers, profile_findings, with_oom_evidence

EXIT_FINDINGS = 1
EXIT_NO_DATA = 3


class NoDataError(Exception):
    """Not one endpoint could be scraped."""


def duration_option(text: str) -> float:
    """An option's duration (``500ms``, ``30s``, ``1h30m``; see :mod:`inferwatch.common.durations`), with
    the parser's message as argparse's."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def promql_duration(seconds: float) -> str:
    """A duration PromQL accepts: whole seconds, or milliseconds below that."""
    return f"{round(seconds)}s" if seconds >= 1 and seconds == round(seconds) else f"{round(seconds * 1e3)}ms"


@dataclass
class PrometheusSource:
    """Series from range queries against a Prometheus server."""

    client: PrometheusClient
    window_s: float
    step_s: float
    rate_window: str
    end: float = field(default_factory=time.time)
    _cache: dict[Expr, Series] = field(default_factory=dict)

    def series(self, expr: Expr) -> Series:
        if expr not in self._cache:
            self._cache[expr] = self.client.query_range(
                expr.promql(self.rate_window), self.end - self.window_s, self.end, self.step_s
            )
        return self._cache[expr]

    def describe(self) -> dict[str, Any]:
        return {
            "prometheus": self.client.url,
            "window_s": self.window_s,
            "step_s": self.step_s,
            "rate_window": self.rate_window,
        }


@dataclass
class ScrapeSource:
    """Series computed from consecutive scrape rounds of live endpoints."""

    snapshots: list[Snapshot]
    rate_window: str
    _cache: dict[Expr, Series] = field(default_factory=dict)

    def series(self, expr: Expr) -> Series:
        if expr not in self._cache:
            out: Series = {}
            for earlier, later in itertools.pairwise(self.snapshots):
                for group, value in expr.evaluate(earlier, later).items():
                    out.setdefault(group, []).append((later.time, value))
            self._cache[expr] = out
        return self._cache[expr]

    def describe(self) -> dict[str, Any]:
        last = self.snapshots[-1].endpoints
        return {
            "endpoints": [{"url": e.url, "up": e.up, "error": e.error} for e in last],
            "samples": len(self.snapshots),
            "rate_window": self.rate_window,
        }


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="a Prometheus server scraping the targets")
    source.add_argument(
        "--endpoint",
        metavar="URL",
        action="append",
        help="an inferwatch /metrics endpoint to scrape directly (repeatable)",
    )
    parser.add_argument(
        "--window",
        type=duration_option,
        default=duration_option("10m"),
        metavar="DURATION",
        help="--prometheus: look back this far (default 10m)",
    )
    parser.add_argument(
        "--step",
        type=duration_option,
        metavar="DURATION",
        help="--prometheus: resolution of the series (default: window / 30, at least 1s)",
    )
    parser.add_argument(
        "--rate-window",
        type=duration_option,
        default=duration_option("1m"),
        metavar="DURATION",
        help="--prometheus: range of rate(); at least twice the scrape interval (default 1m)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=6,
        metavar="N",
        help="--endpoint: scrapes to take (default 6; at least 2)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="--endpoint: time between scrapes (default 2)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time to wait for an answer (default 10)",
    )
    parser.add_argument(
        "--alerts-config",
        type=Path,
        metavar="FILE",
        help="judge by the thresholds of this alert configuration, merged over the defaults as "
        "`inferwatch alerts render --config FILE` does (default: the bundled alerts/config.yaml)",
    )
    parser.add_argument(
        "--profile",
        metavar="URL",
        help="also profile the serving process of this instrumentation endpoint (started with "
        "INFERWATCH_PROFILE=1): the capture's verdict, and the files of OOMs it caught, join the findings",
    )
    parser.add_argument(
        "--profile-steps", type=int, default=20, metavar="N", help="--profile: forward steps (default 20)"
    )
    parser.add_argument(
        "--profile-out", type=Path, default=Path("."), metavar="DIR", help="--profile: where the trace goes"
    )
    parser.add_argument(
        "--profile-user", metavar="USER", help="--profile: basic-auth user (password in $INFERWATCH_PASSWORD)"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def _prometheus_source(args: argparse.Namespace) -> PrometheusSource:
    step = args.step or max(1.0, args.window / 30)
    if step > args.window:
        raise ConfigError(f"--step ({step:g}s) is longer than --window ({args.window:g}s)")
    client = PrometheusClient(args.prometheus, timeout=args.timeout)
    client.version()  # fails here, with one clear line, when the server is not there
    return PrometheusSource(client, args.window, step, promql_duration(args.rate_window))


def _scrape_source(args: argparse.Namespace) -> ScrapeSource:
    if args.samples < 2:
        raise ConfigError("--samples must be at least 2: rates need two scrapes")
    if args.interval <= 0:
        raise ConfigError("--interval must be positive")
    urls = [normalize_url(url) for url in args.endpoint]
    snapshots = []
    for index in range(args.samples):
        if index:
            time.sleep(args.interval)
        snapshots.append(scrape_round(urls, timeout=args.timeout))
        if index == 0:
            down = [e for e in snapshots[0].endpoints if not e.up]
            for endpoint in down:
                print(f"inferwatch diagnose: {endpoint.url} is down: {endpoint.error}", file=sys.stderr)
            if len(down) == len(urls):
                raise NoDataError("no endpoint could be scraped")
    return ScrapeSource(snapshots, promql_duration(args.interval))


def render(diagnosis: Diagnosis, heading: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    console.print(f"[bold]{escape(heading)}[/]\n", soft_wrap=True)
    colors = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
    for finding in diagnosis.findings:
        label = str(finding.severity).upper()
        console.print(
            f"[{colors[finding.severity]}]{label:<8}[/] [bold]{finding.check}[/]  {escape(finding.subject)}",
            soft_wrap=True,
        )
        console.print(f"  {escape(finding.summary)}", soft_wrap=True)
        console.print("  evidence:")
        for evidence in finding.evidence:
            console.print(f"    {escape(evidence.what)}: [bold]{escape(evidence.value)}[/]", soft_wrap=True)
            for line in evidence.query.splitlines():
                console.print(f"      [dim]{escape(line.strip())}[/]", soft_wrap=True)
        console.print("  checklist:")
        for item in finding.checklist:
            console.print(f"    - {escape(item.action)}: {escape(item.rationale)}", soft_wrap=True)
            console.print(f"      [dim]({escape(item.source)})[/]", soft_wrap=True)
        console.print()
    if diagnosis.passed:
        console.print(f"no findings: {', '.join(diagnosis.passed)}", soft_wrap=True)
    for check, reason in diagnosis.not_assessed.items():
        console.print(f"not assessed: {check} ({escape(reason)})", soft_wrap=True)
    counts = {s: sum(1 for f in diagnosis.findings if f.severity == s) for s in Severity}
    if not diagnosis.assessed:
        console.print("\n[bold red]No data to judge:[/] no check found the series it needs in the window.")
    elif diagnosis.alarming:
        summary = ", ".join(
            f"{n} {s}{'s' if n > 1 else ''}" for s, n in sorted(counts.items(), reverse=True) if n
        )
        console.print(f"\n[bold]{summary}[/]")
    else:
        console.print("\n[green]Nothing alarming.[/]")


def _add_profile(diagnosis: Diagnosis, client: ProfileClient, args: argparse.Namespace) -> None:
    """``--profile``: a capture's verdict and the OOM evidence files of the serving process, as findings;
    a capture that cannot be taken is reported as not assessed."""
    try:
        profiled = client.capture(args.profile_steps, 10.0, args.profile_out)
        diagnosis.findings = with_oom_evidence(diagnosis.findings, client.oom_state(), args.profile)
    except ProfileError as exc:
        diagnosis.not_assessed["profile"] = str(exc)
        return
    found = profile_findings(profiled, args.profile)
    if found:
        diagnosis.findings.extend(found)
    else:
        diagnosis.not_assessed["profile"] = profiled.summary.why
    diagnosis.findings.sort(key=lambda f: -f.severity)


def main(args: argparse.Namespace) -> int:
    profile = None  # checked before anything is scraped: a bad URL is a usage error
    if args.profile:
        profile = ProfileClient(args.profile, args.timeout, auth_headers(args.profile_user))
    try:
        limits = Thresholds.from_alerts(load_config(args.alerts_config))
    except AlertsConfigError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        if args.prometheus:
            source: PrometheusSource | ScrapeSource = _prometheus_source(args)
            heading = (
                f"inferwatch diagnose: Prometheus {source.client.url}, the last {args.window:g}s "
                f"in steps of {source.step_s:g}s, rate() over {source.rate_window}"
            )
        else:
            source = _scrape_source(args)
            heading = (
                f"inferwatch diagnose: {len(args.endpoint)} endpoint(s) scraped {args.samples} times "
                f"{args.interval:g}s apart"
            )
        diagnosis = diagnose(source, limits)
    except (PrometheusError, NoDataError) as exc:
        print(f"inferwatch diagnose: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    if profile is not None:
        _add_profile(diagnosis, profile, args)
    if args.json:
        json.dump({"source": source.describe(), **diagnosis.to_dict()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(diagnosis, heading)
    if not diagnosis.assessed:
        return EXIT_NO_DATA
    return EXIT_FINDINGS if diagnosis.alarming else 0
