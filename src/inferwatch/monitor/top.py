"""``inferwatch top``: a live terminal view of inferwatch endpoints, for a person on the box.

It scrapes the exporter and instrumented serving processes every ``--interval`` seconds and shows, per GPU,
utilization and the share of SMs active (NVML GPM, yellow when far below utilization: launch-bound),
memory and headroom, power against its limit, SM clock against its maximum with the active
throttle reasons, temperature against the slowdown threshold, and the models and Kubernetes pods it
serves; per model, the GPU it runs on with that GPU's SM clock share and throttle reasons (the two joined
by the GPU's UUID, never by index or host), TTFT and ITL percentiles of the last interval and the p99
queue time, tokens/s, running and waiting requests, KV-cache bytes and
headroom, the blocks used and preemptions of a paged KV cache (continuous batching), the busy ratio, and
where a model speculates (assisted generation, prompt lookup) the share of its draft tokens it accepted;
the host and the serving processes' CPU and memory. An endpoint that stops answering is shown as down and
scraped again at the next refresh.

``--once`` prints one frame and exits (1 when an endpoint is down): two scrapes ``--window`` seconds apart,
plain text when stdout is not a terminal, JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from inferwatch.monitor.checks.launch_bound import is_launch_bound
from inferwatch.monitor.checks.thresholds import default_thresholds
from inferwatch.monitor.columns import Column, fit_table
from inferwatch.monitor.frame import Frame, GpuRow, ModelRow, build_frame
from inferwatch.monitor.scrape import normalize_url, scrape_round
from inferwatch.monitor.units import duration, number, percent, size

from .errors import ConfigError
from .keys import terminal_keys

# Where `inferwatch demo` / instrument() and `inferwatch-exporter` listen by default (a test keeps these
# in step with inferwatch.instrumentation.endpoint.server.DEFAULT_PORT and
# inferwatch.exporter.config.DEFAULT_PORT, which this module must not import: the monitor runs without
# torch and without NVML).
SERVING_DEFAULT_URL = "http://127.0.0.1:8797/metrics"
EXPORTER_DEFAULT_URL = "http://127.0.0.1:8798/metrics"
# A GPU this close to its slowdown temperature is shown in red: clocks are about to drop.
TEMPERATURE_MARGIN_CELSIUS = 5.0
LOW_FREE_MEMORY = 0.10
LOW_BUSY_RATIO = 0.5
#: The narrowest layout ``--columns`` asks for: a model's name and one figure.
MIN_COLUMNS = 40


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _width(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of columns, got {text!r}") from None
    if value < MIN_COLUMNS:
        raise argparse.ArgumentTypeError(f"expected at least {MIN_COLUMNS} columns, got {text!r}")
    return value


#: Exceptions of ``main`` that mean bad configuration: the ``inferwatch`` dispatcher prints them in one
#: line and exits with status 2.
USAGE_ERRORS = (ConfigError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "urls",
        nargs="*",
        metavar="URL",
        help=f"metrics endpoints: host:port or URLs (default {SERVING_DEFAULT_URL} {EXPORTER_DEFAULT_URL})",
    )
    parser.add_argument(
        "--interval",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="time between refreshes (default 2)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument(
        "--window",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="--once: time between the two scrapes that rates and percentiles come from (default 2)",
    )
    parser.add_argument("--json", action="store_true", help="--once: print the frame as JSON")
    parser.add_argument(
        "--view",
        choices=[view.name for view in VIEWS],
        default=DEFAULT_VIEW.name,
        help="the columns shown (default overview); in the live mode a key switches: v the next view",
    )
    parser.add_argument(
        "--columns",
        type=_width,
        metavar="N",
        help="lay the tables out for N columns (default: the terminal's width; every column when piped)",
    )
    parser.add_argument(
        "--timeout", type=_positive, default=2.0, metavar="SECONDS", help="time a scrape may take (default 2)"
    )


# --- rendering ----------------------------------------------------------------------------------------


def _or_dash(value: float | None, fmt: Callable[[float], str]) -> str:
    return "-" if value is None else fmt(value)


def _pair(value: float | None, limit: float | None, fmt: Callable[[float], str], unit: str = "") -> str:
    return f"{_or_dash(value, fmt)}/{_or_dash(limit, fmt)}{unit}"


def _percentiles(p50: float | None, p99: float | None) -> Text:
    """``18.8/39.5 ms``: the unit once where both share it, else each with its own (``850 ms/1.20 s``)."""
    if p50 is None and p99 is None:
        return Text("-")
    low, high = _or_dash(p50, duration), _or_dash(p99, duration)
    low_figure, _, low_unit = low.partition(" ")
    high_figure, _, high_unit = high.partition(" ")
    if low_unit and low_unit == high_unit:
        return Text(f"{low_figure}/{high_figure} {low_unit}")
    return Text(f"{low}/{high}")


def _styled(text: str, alarm: bool, style: str = "yellow") -> Text:
    return Text(text, style=style if alarm else "")


def _age(seconds: float) -> str:
    """A request's age to the second: ``0 s`` (none runs, or under a second), ``42 s``, ``12m 05s``,
    ``1.5 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m {rest:02d}s"
    return f"{seconds / 3600:.1f} h"


def _finish_reasons(row: ModelRow) -> Text:
    """The window's finished requests by reason (stop / length / cancelled / error or oom), in percent of
    them; "-" where none finished."""
    failed = (row.finished_error_ratio, row.finished_oom_ratio)
    shares = (row.finished_stop_ratio, row.finished_length_ratio, row.finished_cancelled_ratio, *failed)
    if all(share is None for share in shares):
        return Text("-")
    cells = (*shares[:3], sum(share or 0 for share in failed))
    return Text("/".join(f"{(share or 0) * 100:.0f}" for share in cells))


def _gpu_clock(row: ModelRow) -> Text:
    throttled = ", ".join(row.gpu_throttle_reasons)
    return _styled(
        f"{row.gpu or '-'}: {_or_dash(row.gpu_sm_clock_ratio, percent)}"
        + (f" {throttled}" if throttled else ""),
        bool(throttled),
        "bold red",
    )


def _requests(row: ModelRow) -> Text:
    """Running / waiting; waiting in yellow where InferwatchRequestsQueueing would count (its `for:`
    aside)."""
    queueing = (row.requests_waiting or 0) > default_thresholds().requests_waiting_above
    return Text.assemble(
        _or_dash(row.requests_running, number),
        "/",
        _styled(_or_dash(row.requests_waiting, number), queueing),
    )


def _paged(row: ModelRow) -> bool:
    """A paged KV cache (continuous batching): a model served by generate has no blocks, and its
    preemption counter (if any) stays at zero."""
    return row.kv_blocks_used_ratio is not None or bool(row.kv_preemptions_per_second)


def _host_bound(row: ModelRow) -> bool:
    return row.busy_ratio is not None and row.busy_ratio < LOW_BUSY_RATIO and (row.requests_running or 0) > 0


#: The spec accept column's header; shown only where a model has draft tokens (speculative decoding).
SPEC_COLUMN = "spec\naccept"
#: Columns of a frame printed to a pipe or a file: every column of every table fits, unshortened.
PIPE_WIDTH = 400

#: The models table, in its order. ``priority`` says which columns a narrow terminal keeps: the essential
#: ones answer "is it slow, and why" in 80 columns (latency, throughput, load, KV headroom, busy), the
#: next ones fill 120 (queue time, finish reasons, the oldest request, KV bytes, preemptions).
#: Headers of two lines keep a column as narrow as its values. Yellow where the alerts would count (their
#: `for:` aside): InferwatchQueueTimeHigh, InferwatchRequestStuck, InferwatchKvCacheNearlyFull,
#: InferwatchKvCachePreemptions.
MODEL_COLUMNS: tuple[Column[ModelRow], ...] = (
    Column("model", lambda r: Text(r.model), 0, essential=True, shortens=True),
    Column("instance", lambda r: Text(r.instance), 14),
    Column("device", lambda r: Text(r.device or "-"), 15),
    Column("GPU: clock", _gpu_clock, 12),
    Column("TTFT\np50/p99", lambda r: _percentiles(r.ttft_p50_seconds, r.ttft_p99_seconds), 1, True),
    Column(
        "queue\np99",
        lambda r: _styled(
            _or_dash(r.queue_p99_seconds, duration),
            (r.queue_p99_seconds or 0) > default_thresholds().queue_seconds_above,
        ),
        7,
    ),
    Column("ITL\np50/p99", lambda r: _percentiles(r.itl_p50_seconds, r.itl_p99_seconds), 2, True),
    Column(
        "first content\np50/p99",
        lambda r: _percentiles(r.first_content_p50_seconds, r.first_content_p99_seconds),
        16,
    ),
    Column("tok/s", lambda r: Text(_or_dash(r.tokens_per_second, lambda v: f"{v:.1f}")), 3, True),
    Column("stop/len/\ncxl/err %", _finish_reasons, 8),
    Column("run/\nwait", _requests, 4, True),
    Column(
        "oldest",
        lambda r: _styled(
            _or_dash(r.oldest_running_age_seconds, _age),
            (r.oldest_running_age_seconds or 0) > default_thresholds().request_age_seconds_above,
        ),
        9,
    ),
    Column("KV\ncache", lambda r: Text(_or_dash(r.kv_cache_bytes, size)), 10),
    Column("KV\nheadroom", lambda r: Text(_or_dash(r.kv_cache_headroom_tokens, number)), 5, True),
    Column(
        "KV blocks used",
        lambda r: _styled(
            _or_dash(r.kv_blocks_used_ratio, percent),
            (r.kv_blocks_used_ratio or 0) > default_thresholds().kv_blocks_used_ratio_above,
        ),
        13,
    ),
    Column(
        "preempt\n/s",
        lambda r: _styled(
            _or_dash(r.kv_preemptions_per_second if _paged(r) else None, number),
            (r.kv_preemptions_per_second or 0) > default_thresholds().preemptions_per_second_above,
        ),
        11,
    ),
    Column("cancel\n/s", lambda r: Text(_or_dash(r.cancelled_per_second, number)), 17),
    Column("wasted\ntok/s", lambda r: Text(_or_dash(r.wasted_tokens_per_second, number)), 18),
    # Yellow under half while requests run: host-bound.
    Column("busy", lambda r: _styled(_or_dash(r.busy_ratio, percent), _host_bound(r)), 6, True),
    Column(SPEC_COLUMN, lambda r: Text(_or_dash(r.spec_acceptance_ratio, percent)), 19),
)


def _gpu_memory_free(row: GpuRow) -> Text:
    share = (
        row.memory_free_bytes / row.memory_total_bytes
        if row.memory_free_bytes is not None and row.memory_total_bytes
        else None
    )
    return _styled(_or_dash(share, percent), share is not None and share < LOW_FREE_MEMORY, "bold red")


def _gpu_sm_active(row: GpuRow) -> Text:
    # Yellow where `inferwatch diagnose` would find the GPU launch-bound.
    launch_bound = (
        row.utilization is not None
        and row.sm_active is not None
        and is_launch_bound(row.utilization, row.sm_active)
    )
    return _styled(_or_dash(row.sm_active, percent), launch_bound)


def _gpu_temperature(row: GpuRow) -> Text:
    hot = (
        row.temperature_celsius is not None
        and row.slowdown_celsius is not None
        and row.temperature_celsius >= row.slowdown_celsius - TEMPERATURE_MARGIN_CELSIUS
    )
    return _styled(
        _pair(row.temperature_celsius, row.slowdown_celsius, lambda c: f"{c:.0f}", " °C"), hot, "bold red"
    )


def _ratio(value: float | None, limit: float | None) -> float | None:
    return value / limit if value is not None and limit else None


#: The GPUs table, in its order; in 80 columns: index, utilization, memory, power, SM clock share and the
#: throttle reasons (NVML's names, as the alerts and `--json` have them).
GPU_COLUMNS: tuple[Column[GpuRow], ...] = (
    Column("instance", lambda r: Text(r.instance), 10),
    Column("gpu", lambda r: Text(r.gpu) if r.up != 0 else Text(f"{r.gpu} lost", style="bold red"), 0, True),
    Column("name", lambda r: Text(r.name or "-"), 11),
    Column("util", lambda r: Text(_or_dash(r.utilization, percent)), 1, True),
    Column("SM\nactive", _gpu_sm_active, 6),
    Column(
        "memory",
        lambda r: Text(
            _pair(r.memory_used_bytes, r.memory_total_bytes, lambda b: f"{b / 2**30:.1f}", " GiB")
        ),
        2,
        True,
    ),
    Column("free", _gpu_memory_free, 8),
    Column(
        "power",
        lambda r: Text(_pair(r.power_watts, r.power_limit_watts, lambda w: f"{w:.0f}", " W")),
        3,
        True,
    ),
    Column("SM\nclock", lambda r: Text(_or_dash(_ratio(r.sm_clock_hz, r.sm_clock_max_hz), percent)), 4, True),
    Column(
        "SM clock\nMHz",
        lambda r: Text(_pair(r.sm_clock_hz, r.sm_clock_max_hz, lambda hz: f"{hz / 1e6:.0f}", " MHz")),
        9,
    ),
    Column("temp/\nslowdown", _gpu_temperature, 7),
    Column(
        "throttle",
        lambda r: Text(
            ", ".join(r.throttle_reasons) or "-", style="bold red" if r.throttle_reasons else "dim"
        ),
        5,
        True,
    ),
    Column("serving", lambda r: Text(", ".join(r.serving) or "-"), 12),
)


@dataclass(frozen=True)
class View:
    """A set of columns a key switches to: ``None`` keeps a table's every column, ``()`` leaves it out."""

    name: str
    key: str
    models: tuple[str, ...] | None
    gpus: tuple[str, ...] | None


#: The views of the live mode (the key is the name's first letter; ``v`` goes to the next one) and of
#: ``--view``. Each shows whole what a narrow terminal leaves out of the overview.
VIEWS: tuple[View, ...] = (
    View("overview", "o", None, None),
    View(
        "latency",
        "l",
        ("model", "instance", "TTFT\np50/p99", "queue\np99", "ITL\np50/p99", "tok/s", "run/\nwait",
         "oldest", "busy"),
        ("gpu", "util", "SM\nactive", "SM\nclock", "temp/\nslowdown", "throttle"),
    ),
    View(
        "memory",
        "m",
        ("model", "instance", "run/\nwait", "KV\ncache", "KV\nheadroom", "KV blocks used", "preempt\n/s"),
        ("gpu", "instance", "memory", "free", "serving"),
    ),
    View("gpu", "g", ("model", "instance", "device", "GPU: clock", "busy", "tok/s"), None),
    View(
        "edge",
        "e",
        ("model", "instance", "first content\np50/p99", "TTFT\np50/p99", "queue\np99", "cancel\n/s",
         "wasted\ntok/s", "stop/len/\ncxl/err %", "run/\nwait"),
        (),
    ),
)  # fmt: skip
DEFAULT_VIEW = VIEWS[0]


def view_named(name: str) -> View:
    return next(view for view in VIEWS if view.name == name)


def view_after(view: View, key: str) -> View:
    """The view a key switches to from ``view``: ``v`` the next, a view's key that view, else ``view``."""
    if key == "v":
        return VIEWS[(VIEWS.index(view) + 1) % len(VIEWS)]
    return next((other for other in VIEWS if other.key == key), view)


def _in_view(columns: Sequence[Column[Any]], headers: tuple[str, ...] | None) -> list[Column[Any]]:
    return list(columns) if headers is None else [column for column in columns if column.header in headers]


def model_columns(frame: Frame, view: View = DEFAULT_VIEW) -> list[Column[ModelRow]]:
    """The models table's columns in ``view``: busy only where a model has a busy ratio (on a GPU),
    spec accept only where one drafts tokens; the instance essential where two models share a name."""
    has = {
        "busy": any(row.busy_ratio is not None for row in frame.models),
        SPEC_COLUMN: _speculating(frame),
    }
    names = [row.model for row in frame.models]
    shared_names = len(set(names)) < len(names)
    columns = []
    for column in _in_view(MODEL_COLUMNS, view.models):
        if not has.get(column.header, True):
            continue
        if column.header == "instance" and shared_names:
            column = dataclasses.replace(column, priority=0, essential=True)
        columns.append(column)
    return columns


def _speculating(frame: Frame) -> bool:
    return any(row.spec_draft_tokens_per_second is not None for row in frame.models)


def _host_table() -> tuple[Column[tuple[str, ...]], ...]:
    return tuple(
        Column(header, lambda r, i=i: Text(r[i]), priority, essential)
        for i, (header, priority, essential) in enumerate(
            (("instance", 2, False), ("process", 0, True), ("CPU", 1, True), ("memory", 1, True))
        )
    )


def _host_rows(frame: Frame) -> list[tuple[str, ...]]:
    rows = [
        (
            row.instance,
            "host",
            f"{_or_dash(row.cpu_busy_ratio, percent)} of {_or_dash(row.cpus, number)} cores",
            f"{_or_dash(row.memory_available_bytes, size)} free of {_or_dash(row.memory_total_bytes, size)}",
        )
        for row in frame.hosts
    ]
    rows += [
        (
            process.instance,
            f"{process.comm} ({process.pid})",
            f"{_or_dash(process.cpu_cores, lambda c: f'{c:.2f}')} cores",
            _or_dash(process.resident_memory_bytes, size),
        )
        for process in frame.processes
    ]
    return rows


def _endpoints_table(frame: Frame) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("endpoint", no_wrap=True)
    table.add_column("status", overflow="fold")  # an error message wraps; a figure never does
    table.add_column("scrape", no_wrap=True)
    table.add_column("samples", no_wrap=True)
    for endpoint in frame.endpoints:
        status = (
            Text("up", style="green") if endpoint.up else Text(f"down: {endpoint.error}", style="bold red")
        )
        table.add_row(endpoint.url, status, duration(endpoint.scrape_seconds), str(endpoint.samples))
    return table


@dataclass(frozen=True)
class Screen:
    """One screen of ``inferwatch top``, laid out for the width it is drawn in (a terminal's, re-read at
    every refresh, so a resized terminal gets its columns at once), or for ``columns``.

    ``hint`` tells, beside a table with hidden columns, how to see them.
    """

    frame: Frame
    view: View = DEFAULT_VIEW
    columns: int | None = None
    hint: str = "--view, --columns"
    now: datetime.datetime | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = self.columns or options.max_width
        frame = self.frame
        up = sum(1 for e in frame.endpoints if e.up)
        stamp = (self.now or datetime.datetime.now()).strftime("%H:%M:%S")
        window = (
            "first scrape, no rates yet"
            if frame.window_seconds is None
            else f"window {frame.window_seconds:.1f}s"
        )
        yield Text(
            f"inferwatch top  {stamp}  {window}  {up}/{len(frame.endpoints)} endpoints up"
            f"  view: {self.view.name}",
            style="bold",
        )
        sections: list[tuple[str, Sequence[Column[Any]], Sequence[Any]]] = [
            ("models", model_columns(frame, self.view), frame.models),
            ("GPUs", _in_view(GPU_COLUMNS, self.view.gpus), frame.gpus),
        ]
        if self.view == DEFAULT_VIEW:
            sections.append(("host and serving processes", _host_table(), _host_rows(frame)))
        for title, columns, rows in sections:
            if not rows or not columns:
                continue
            fitted = fit_table(columns, rows, width)
            heading = Text(f"\n{title}", style="bold")
            if fitted.hidden:
                heading.append(f"  +{fitted.hidden} columns hidden ({self.hint})", style="dim")
            yield heading
            yield fitted.table
        if self.view == DEFAULT_VIEW:
            yield Text("\nendpoints", style="bold")
            yield _endpoints_table(frame)


# --- the command --------------------------------------------------------------------------------------


def _console(columns: int | None) -> Console:
    if columns:
        return Console(width=columns)
    console = Console()
    if not console.is_terminal:
        # A pipe or a file: no ANSI codes (rich's default there) and no wrapping at an assumed 80 columns:
        # room for every column of every table at full width, like `top -b`.
        console = Console(width=max(console.width, PIPE_WIDTH))
    return console


def _once(urls: Sequence[str], args: argparse.Namespace) -> int:
    first = scrape_round(urls, args.timeout)
    time.sleep(max(0.0, args.window - (time.monotonic() - first.time)))
    frame = build_frame(first, scrape_round(urls, args.timeout))
    if args.json:
        json.dump(frame.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _console(args.columns).print(Screen(frame, view_named(args.view)))
    down = [e for e in frame.endpoints if not e.up]
    for endpoint in down:
        print(f"inferwatch top: {endpoint.url} is down: {endpoint.error}", file=sys.stderr)
    return 1 if down else 0


def _frames(urls: Sequence[str], args: argparse.Namespace) -> Iterator[Frame]:
    """A first frame of instant values at once, then one frame per interval, forever."""
    previous = scrape_round(urls, args.timeout)
    yield build_frame(None, previous)
    while True:
        time.sleep(max(0.0, args.interval - (time.monotonic() - previous.time)))
        current = scrape_round(urls, args.timeout)
        yield build_frame(previous, current)
        previous = current


#: Beside a table with hidden columns in the live mode: how to see them.
LIVE_HINT = "v: views"


def _interactive(console: Console, urls: Sequence[str], args: argparse.Namespace) -> None:
    """The alternate screen, like top and htop (the terminal is restored on exit): a new frame every
    interval, and at once another view when its key is pressed."""
    from rich.live import Live

    view = view_named(args.view)
    previous = scrape_round(urls, args.timeout)
    frame = build_frame(None, previous)

    def screen() -> Screen:
        return Screen(frame, view, args.columns, LIVE_HINT)

    with (
        terminal_keys() as read_key,
        Live(screen(), console=console, auto_refresh=False, screen=True) as live,
    ):
        while True:
            key = read_key(args.interval - (time.monotonic() - previous.time))
            if key == "q":
                return
            if key is not None:
                view = view_after(view, key)
            else:
                current = scrape_round(urls, args.timeout)
                frame, previous = build_frame(previous, current), current
            live.update(screen(), refresh=True)


def _live(urls: Sequence[str], args: argparse.Namespace) -> int:
    console = _console(args.columns)
    try:
        if console.is_terminal:
            _interactive(console, urls, args)
        else:
            # Batch mode, like `top -b`: one frame after another.
            for frame in _frames(urls, args):
                console.print(Screen(frame, view_named(args.view)))
    except KeyboardInterrupt:
        pass
    return 0


def main(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise ConfigError("--json needs --once: a live view has no single frame to print")
    urls = [normalize_url(url) for url in args.urls] or [SERVING_DEFAULT_URL, EXPORTER_DEFAULT_URL]
    return _once(urls, args) if args.once else _live(urls, args)
