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
import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from inferwatch.monitor.checks.launch_bound import is_launch_bound
from inferwatch.monitor.checks.thresholds import default_thresholds
from inferwatch.monitor.frame import Frame, GpuRow, ModelRow, build_frame
from inferwatch.monitor.scrape import normalize_url, scrape_round
from inferwatch.monitor.units import duration, number, percent, size

from .errors import ConfigError

# Where `inferwatch demo` / instrument() and `inferwatch-exporter` listen by default (a test keeps these in
# step with inferwatch.instrumentation.exposition.DEFAULT_PORT and inferwatch.exporter.config.DEFAULT_PORT,
# which this module must not import: the monitor runs without torch and without NVML).
SERVING_DEFAULT_URL = "http://127.0.0.1:8797/metrics"
EXPORTER_DEFAULT_URL = "http://127.0.0.1:8798/metrics"
# A GPU this close to its slowdown temperature is shown in red: clocks are about to drop.
TEMPERATURE_MARGIN_CELSIUS = 5.0
LOW_FREE_MEMORY = 0.10
LOW_BUSY_RATIO = 0.5


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
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
        "--timeout", type=_positive, default=2.0, metavar="SECONDS", help="time a scrape may take (default 2)"
    )


# --- rendering ----------------------------------------------------------------------------------------


def _or_dash(value: float | None, fmt: Callable[[float], str]) -> str:
    return "-" if value is None else fmt(value)


def _pair(value: float | None, limit: float | None, fmt: Callable[[float], str], unit: str = "") -> str:
    return f"{_or_dash(value, fmt)}/{_or_dash(limit, fmt)}{unit}"


def _percentiles(p50: float | None, p99: float | None) -> str:
    return f"{_or_dash(p50, duration)} / {_or_dash(p99, duration)}"


GPU_COLUMNS = (
    "instance", "gpu", "name", "util", "SM active", "memory", "free", "power", "SM clock", "temp/slowdown",
    "throttle", "serving",
)  # fmt: skip
MODEL_COLUMNS = (
    "model", "instance", "device", "GPU: clock", "TTFT p50 / p99", "queue p99", "ITL p50 / p99",
    "tok/s", "stop/len/cxl/err", "running", "waiting", "oldest", "KV cache", "KV headroom (tok)",
    "KV blocks used", "preempt/s", "busy",
)  # fmt: skip
#: Columns of a frame printed to a pipe or a file: the models table's all fit, unshortened.
PIPE_WIDTH = 400
#: Shown only where a model has draft tokens (speculative decoding): accepted / draft tokens of the window.
SPEC_COLUMN = "spec accept"


def _speculating(frame: Frame) -> bool:
    return any(row.spec_draft_tokens_per_second is not None for row in frame.models)


def _gpu_cells(row: GpuRow) -> list[Any]:
    from rich.text import Text

    free_share = (
        row.memory_free_bytes / row.memory_total_bytes
        if row.memory_free_bytes is not None and row.memory_total_bytes
        else None
    )
    hot = (
        row.temperature_celsius is not None
        and row.slowdown_celsius is not None
        and row.temperature_celsius >= row.slowdown_celsius - TEMPERATURE_MARGIN_CELSIUS
    )
    throttle = Text(
        ", ".join(row.throttle_reasons) or "-", style="bold red" if row.throttle_reasons else "dim"
    )
    # Yellow where `inferwatch diagnose` would find the GPU launch-bound.
    launch_bound = (
        row.utilization is not None
        and row.sm_active is not None
        and is_launch_bound(row.utilization, row.sm_active)
    )
    return [
        row.instance,
        row.gpu if row.up != 0 else Text(f"{row.gpu} lost", style="bold red"),
        row.name or "-",
        _or_dash(row.utilization, percent),
        Text(_or_dash(row.sm_active, percent), style="yellow" if launch_bound else ""),
        _pair(row.memory_used_bytes, row.memory_total_bytes, lambda b: f"{b / 2**30:.1f}", " GiB"),
        Text(
            _or_dash(free_share, percent),
            style="bold red" if free_share is not None and free_share < LOW_FREE_MEMORY else "",
        ),
        _pair(row.power_watts, row.power_limit_watts, lambda w: f"{w:.0f}", " W"),
        _pair(row.sm_clock_hz, row.sm_clock_max_hz, lambda hz: f"{hz / 1e6:.0f}", " MHz"),
        Text(
            _pair(row.temperature_celsius, row.slowdown_celsius, lambda c: f"{c:.0f}", " °C"),
            style="bold red" if hot else "",
        ),
        throttle,
        ", ".join(row.serving) or "-",
    ]


def _age(seconds: float) -> str:
    """A request's age to the second: ``0 s`` (none runs, or under a second), ``42 s``, ``12m 05s``,
    ``1.5 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m {rest:02d}s"
    return f"{seconds / 3600:.1f} h"


def _finish_reasons(row: ModelRow) -> str:
    """The window's finished requests by reason (stop / length / cancelled / error or oom), in percent of
    them; "-" where none finished."""
    failed = (row.finished_error_ratio, row.finished_oom_ratio)
    shares = (row.finished_stop_ratio, row.finished_length_ratio, row.finished_cancelled_ratio, *failed)
    if all(share is None for share in shares):
        return "-"
    cells = (*shares[:3], sum(share or 0 for share in failed))
    return "/".join(f"{(share or 0) * 100:.0f}" for share in cells) + " %"


def _model_cells(row: ModelRow) -> list[Any]:
    from rich.text import Text

    host_bound = (
        row.busy_ratio is not None and row.busy_ratio < LOW_BUSY_RATIO and (row.requests_running or 0) > 0
    )
    # Yellow where the queueing alerts would count (their `for:` aside): InferwatchRequestsQueueing and
    # InferwatchQueueTimeHigh's thresholds.
    limits = default_thresholds()
    queueing = (row.requests_waiting or 0) > limits.requests_waiting_above
    queue_long = (row.queue_p99_seconds or 0) > limits.queue_seconds_above
    # InferwatchRequestStuck's bound: a request that has run longer than any should.
    stuck = (row.oldest_running_age_seconds or 0) > limits.request_age_seconds_above
    # A paged KV cache (continuous batching) only: InferwatchKvCacheNearlyFull's and
    # InferwatchKvCachePreemptions' thresholds. A model served by generate has no blocks, and its
    # preemption counter (if any) stays at zero: both cells are "-".
    paged = row.kv_blocks_used_ratio is not None or bool(row.kv_preemptions_per_second)
    nearly_full = (row.kv_blocks_used_ratio or 0) > limits.kv_blocks_used_ratio_above
    preempting = (row.kv_preemptions_per_second or 0) > limits.preemptions_per_second_above
    throttled = ", ".join(row.gpu_throttle_reasons)
    return [
        row.model,
        row.instance,
        row.device or "-",
        Text(
            f"{row.gpu or '-'}: {_or_dash(row.gpu_sm_clock_ratio, percent)}"
            + (f" {throttled}" if throttled else ""),
            style="bold red" if throttled else "",
        ),
        _percentiles(row.ttft_p50_seconds, row.ttft_p99_seconds),
        Text(_or_dash(row.queue_p99_seconds, duration), style="yellow" if queue_long else ""),
        _percentiles(row.itl_p50_seconds, row.itl_p99_seconds),
        _or_dash(row.tokens_per_second, lambda v: f"{v:.1f}"),
        _finish_reasons(row),
        _or_dash(row.requests_running, number),
        Text(_or_dash(row.requests_waiting, number), style="yellow" if queueing else ""),
        Text(_or_dash(row.oldest_running_age_seconds, _age), style="yellow" if stuck else ""),
        _or_dash(row.kv_cache_bytes, size),
        _or_dash(row.kv_cache_headroom_tokens, number),
        Text(_or_dash(row.kv_blocks_used_ratio, percent), style="yellow" if nearly_full else ""),
        Text(
            _or_dash(row.kv_preemptions_per_second if paged else None, number),
            style="yellow" if preempting else "",
        ),
        Text(_or_dash(row.busy_ratio, percent), style="yellow" if host_bound else ""),
    ]


def render(frame: Frame, now: datetime.datetime | None = None) -> Any:
    """The frame as a rich renderable: a heading and one table per kind of row."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def table(title: str, headers: Sequence[str]) -> Table:
        out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for header in headers:
            out.add_column(header, no_wrap=True)
        return out

    up = sum(1 for e in frame.endpoints if e.up)
    stamp = (now or datetime.datetime.now()).strftime("%H:%M:%S")
    window = (
        "first scrape, no rates yet"
        if frame.window_seconds is None
        else f"window {frame.window_seconds:.1f}s"
    )
    parts: list[Any] = [
        Text(f"inferwatch top  {stamp}  {window}  {up}/{len(frame.endpoints)} endpoints up", style="bold")
    ]

    if frame.gpus:
        gpus = table("GPUs", GPU_COLUMNS)
        for row in frame.gpus:
            gpus.add_row(*_gpu_cells(row))
        parts.append(gpus)
    if frame.models:
        speculating = _speculating(frame)
        models = table("models", (*MODEL_COLUMNS, SPEC_COLUMN) if speculating else MODEL_COLUMNS)
        for row in frame.models:
            cells = _model_cells(row)
            if speculating:
                cells.append(_or_dash(row.spec_acceptance_ratio, percent))
            models.add_row(*cells)
        parts.append(models)
    if frame.hosts or frame.processes:
        host = table("host and serving processes", ["instance", "process", "CPU", "memory"])
        for row in frame.hosts:
            host.add_row(
                row.instance,
                "host",
                f"{_or_dash(row.cpu_busy_ratio, percent)} of {_or_dash(row.cpus, number)} cores",
                f"{_or_dash(row.memory_available_bytes, size)} free"
                f" of {_or_dash(row.memory_total_bytes, size)}",
            )
        for process in frame.processes:
            host.add_row(
                process.instance,
                f"{process.comm} ({process.pid})",
                f"{_or_dash(process.cpu_cores, lambda c: f'{c:.2f}')} cores",
                _or_dash(process.resident_memory_bytes, size),
            )
        parts.append(host)
    endpoints = table("endpoints", ["endpoint", "status", "scrape", "samples"])
    for endpoint in frame.endpoints:
        status = (
            Text("up", style="green") if endpoint.up else Text(f"down: {endpoint.error}", style="bold red")
        )
        endpoints.add_row(endpoint.url, status, duration(endpoint.scrape_seconds), str(endpoint.samples))
    parts.append(endpoints)
    return Group(*parts)


# --- the command --------------------------------------------------------------------------------------


def _console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # A pipe or a file: no ANSI codes (rich's default there) and no wrapping at an assumed 80 columns:
        # room for every column of the models table at full width (tables take only what they need).
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
        _console().print(render(frame))
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


def _live(urls: Sequence[str], args: argparse.Namespace) -> int:
    from rich.live import Live

    console = _console()
    frames = _frames(urls, args)
    try:
        if not console.is_terminal:
            # Batch mode, like `top -b`: one frame after another.
            for frame in frames:
                console.print(render(frame))
        # The alternate screen, like top and htop: the terminal is restored on exit.
        with Live(render(next(frames)), console=console, auto_refresh=False, screen=True) as live:
            for frame in frames:
                live.update(render(frame), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def main(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise ConfigError("--json needs --once: a live view has no single frame to print")
    urls = [normalize_url(url) for url in args.urls] or [SERVING_DEFAULT_URL, EXPORTER_DEFAULT_URL]
    return _once(urls, args) if args.once else _live(urls, args)
