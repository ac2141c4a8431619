"""Real services for the tests, each bounded in time and always stopped.

Every helper here is a context manager: it starts a real process (or an in-test HTTP server), waits until
it answers, yields a small handle, and on exit stops what it started, whether the test passed or not.

* :func:`start_process` - any command, ready when an HTTP URL answers 200.
* :func:`start_prometheus` - the ``prometheus`` binary scraping given targets, with rule files and an
  optional Alertmanager; the handle queries through the HTTP API.
* :func:`start_alertmanager` - the ``prometheus-alertmanager`` binary (Debian's name), routing every
  alert to one webhook.
* :func:`start_webhook_receiver` - an HTTP server in a thread collecting the JSON Alertmanager POSTs.
* :func:`start_demo` / :func:`start_exporter` - ``inferwatch demo`` and ``inferwatch-exporter``.
* :func:`start_prometheus_agent` - ``prometheus --enable-feature=agent`` scraping one ``hashmod`` shard of
  the targets and remote-writing what it scrapes (docs/deploy.md, "Past one Prometheus").
* :func:`start_victoria_metrics` / :func:`start_vmalert` - Debian's ``victoria-metrics`` (the store the
  agents write to, queried through its Prometheus-compatible API) and ``vmalert`` (the rules, evaluated
  against it, results written back, alerts sent to an Alertmanager).

A missing binary is an error, never a skip: the integration suite is the proof that the rules and
dashboards work against real services, and a silent skip would hide that the proof did not run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO_ROOT, free_port, http_get
from tests.support.reaper import forget, kill_with_this_process

# How long a stopped process gets to exit after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 10.0
# Lines of a process's log quoted in an error when it fails to start.
LOG_TAIL_LINES = 40


class ServiceError(RuntimeError):
    """A service could not be started, answered with an error, or a wait ran out of time."""


# A tool that runs this long has hung: the test fails rather than waiting for pytest's time-out.
TOOL_TIMEOUT_SECONDS = 120


def require_binary(name: str) -> str:
    """Absolute path of executable ``name``, looked up beside the running interpreter (this
    distribution's console scripts) and then on PATH; raises (never skips) when it is not installed."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise ServiceError(
            f"{name!r} is not installed: run `make system-deps` (Debian packages prometheus, "
            "prometheus-alertmanager, victoria-metrics) or put it on PATH"
        )
    return found


def run_tool(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    timeout: float = TOOL_TIMEOUT_SECONDS,
) -> subprocess.CompletedProcess[str]:
    """Run a real tool (found by :func:`require_binary`: a missing one fails, never skips) in ``cwd``,
    bounded in time, capturing its output; ``env`` is merged over the current environment."""
    return subprocess.run(
        [require_binary(cmd[0]), *cmd[1:]],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    """``path`` when given (the caller owns it), else a temporary directory removed afterwards."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="inferwatch-it-") as tmp:
        yield Path(tmp)


@dataclass
class RunningProcess:
    """A started process, its log file, and the URL that said it was ready."""

    popen: subprocess.Popen[bytes]
    log_path: Path
    ready_url: str

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the process's combined stdout and stderr."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM the process's group, SIGKILL it after a grace period; return the exit status."""
        if self.popen.poll() is None:
            # The process was started in its own session, so its group holds it and only its children.
            with suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=STOP_GRACE_SECONDS)
        return self.popen.returncode


def _wait_ready(proc: RunningProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise ServiceError(
                f"{proc.popen.args!r} exited with status {proc.popen.returncode} before "
                f"{proc.ready_url} answered; its log:\n{proc.log_tail()}"
            )
        try:
            status, _ = http_get(proc.ready_url, timeout=2.0)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise ServiceError(
        f"{proc.ready_url} did not answer 200 within {timeout}s (last: {last}); "
        f"log of {proc.popen.args!r}:\n{proc.log_tail()}"
    )


@contextmanager
def start_process(
    cmd: Sequence[str],
    ready_url: str,
    timeout: float = 60.0,
    *,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[RunningProcess]:
    """Start ``cmd``, yield once ``ready_url`` answers 200 within ``timeout`` seconds, always stop it
    (with the test process too, if that ends first: :mod:`.reaper`).

    ``env`` is merged over the current environment. Output goes to ``log_path`` (a temporary file when
    not given), quoted in the error when the process dies or never gets ready.
    """
    with _workdir(None if log_path is None else log_path.parent) as logdir:
        log_file = log_path or logdir / "process.log"
        with log_file.open("wb") as log:
            popen = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        kill_with_this_process(popen.pid)
        proc = RunningProcess(popen, log_file, ready_url)
        try:
            _wait_ready(proc, timeout)
            yield proc
        finally:
            proc.stop()
            forget(popen.pid)


def run_inferwatch(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real ``inferwatch`` command to its end; stdout is a pipe, so its output is plain text."""
    return subprocess.run(
        [require_binary("inferwatch"), *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_until(
    probe: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.25
) -> Any:
    """Call ``probe`` until it returns something truthy; return that, or raise naming ``what`` (a
    callable is called at the time-out, so the message can show the last state)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise ServiceError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------- Prometheus


class PromQLError(ServiceError):
    """Prometheus refused a query (parse error, bad function, ...)."""


@dataclass
class Prometheus:
    """Handle on a running Prometheus: its base URL and a few HTTP API calls."""

    url: str
    process: RunningProcess

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; a non-success answer raises PromQLError."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10.0)
        try:
            answer = json.loads(body)
        except json.JSONDecodeError as exc:
            raise PromQLError(f"{path} {params}: HTTP {status}, not JSON: {body[:200]!r}") from exc
        if answer.get("status") != "success":
            raise PromQLError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query: the result list (each ``{"metric": {...}, "value": [ts, "v"]}``)."""
        data = self.api("query", query=expr)
        if data["resultType"] not in ("vector", "matrix"):
            # A scalar or string: wrap it so callers always get a list of series-like entries.
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def wait_for_series(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns at least one series."""
        return wait_until(lambda: self.query(expr), timeout, f"{expr!r} to return a series")

    def targets_up(self) -> dict[str, str]:
        """Scrape URL -> health (``up``/``down``/``unknown``) of every active target."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Wait until every configured target has been scraped successfully."""

        def all_up() -> bool:
            health = self.targets_up()
            return bool(health) and all(h == "up" for h in health.values())

        wait_until(all_up, timeout, lambda: f"all targets up (last: {self.targets_up()})")

    def wait_for_history(self, selector: str, seconds: float) -> float:
        """Until ``selector`` has ``seconds`` worth of samples (one a second: the default scrape interval)
        in some series that is live now; returns the newest sample's time.

        Live, because the window may still hold a stopped target's samples (a restarted exporter's first
        life) while its series are stale-marked and the new life has not been scraped yet."""
        expr = f"count_over_time({selector}[{int(seconds) + 5}s])"

        def live_sample_times() -> list[float]:
            if not any(float(r["value"][1]) >= seconds for r in self.query(expr)):
                return []
            return [float(r["value"][1]) for r in self.query(f"timestamp({selector})")]

        return max(wait_until(live_sample_times, seconds + 120, f"{seconds}s of {selector} in Prometheus"))

    def alerts(self) -> list[dict[str, Any]]:
        """Active (pending or firing) alerts as Prometheus sees them."""
        return self.api("alerts")["alerts"]

    def rule_groups(self) -> list[dict[str, Any]]:
        """Loaded rule groups with their rules, health and last error."""
        return self.api("rules")["groups"]


def prometheus_config(
    targets: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    interval: str = "1s",
) -> dict[str, Any]:
    """A prometheus.yml as a dict: one job per ``targets`` key (job name -> ``host:port`` list)."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addrs)}]} for job, addrs in targets.items()
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


@contextmanager
def start_prometheus(
    targets: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    *,
    alertmanager: str | None = None,
    interval: str = "1s",
    workdir: Path | None = None,
    enable_lifecycle: bool = False,
    timeout: float = 60.0,
) -> Iterator[Prometheus]:
    """A real Prometheus on a free loopback port, TSDB in a temporary directory.

    ``targets`` maps job name to ``host:port`` addresses; ``alertmanager`` is the ``host:port`` of an
    Alertmanager to notify; ``interval`` is both the scrape and the rule evaluation interval.
    """
    binary = require_binary("prometheus")
    with _workdir(workdir) as work:
        config_path = work / "prometheus.yml"
        config = prometheus_config(targets, rule_files, alertmanager, interval)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port = free_port()
        cmd = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            # Firing alerts are re-sent at this period (default 1m): alerts evaluated before the
            # notifier has discovered the Alertmanager are dropped, and would otherwise wait a minute.
            f"--rules.alert.resend-delay={interval}",
        ]
        if enable_lifecycle:
            cmd.append("--web.enable-lifecycle")
        url = f"http://127.0.0.1:{port}"
        with start_process(cmd, f"{url}/-/ready", timeout, log_path=work / "prometheus.log") as proc:
            yield Prometheus(url, proc)


# -------------------------------------------------------------------------------------------- Alertmanager


@dataclass
class WebhookReceiver:
    """Collects the JSON bodies POSTed to it (Alertmanager's webhook payloads), in arrival order."""

    url: str
    notifications: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[dict[str, Any]]:
        """A snapshot of every payload received so far."""
        with self._lock:
            return list(self.notifications)

    def add(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.notifications.append(payload)

    def wait_for_alert(
        self, alertname: str, status: str, timeout: float = 60.0, *, since: int = 0
    ) -> dict[str, Any]:
        """The first alert named ``alertname`` received with ``status`` (``firing``/``resolved``), in
        the payloads from index ``since`` on (``len(received())`` before an action: only what followed)."""

        def find() -> dict[str, Any] | None:
            for payload in self.received()[since:]:
                for alert in payload.get("alerts", []):
                    if alert["labels"].get("alertname") == alertname and alert["status"] == status:
                        return alert
            return None

        return wait_until(
            find, timeout, lambda: f"a {status} {alertname} notification (got {self.received()})"
        )


@contextmanager
def start_webhook_receiver() -> Iterator[WebhookReceiver]:
    """An HTTP server on a free loopback port, in a thread, that records every JSON POST body."""
    port = free_port()
    receiver = WebhookReceiver(url=f"http://127.0.0.1:{port}/")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            try:
                receiver.add(json.loads(body))
            except json.JSONDecodeError:
                self.send_response(400)
            else:
                self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test asserts on what arrived, not on access logs."""

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=STOP_GRACE_SECONDS)


@dataclass
class Alertmanager:
    """Handle on a running Alertmanager."""

    url: str
    address: str  # host:port, what Prometheus's alerting config names
    process: RunningProcess

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds now (``/api/v2/alerts``: active, silenced and inhibited; resolved
        ones are gone), each with ``labels``, ``annotations``, ``status`` and ``startsAt``."""
        status, body = http_get(f"{self.url}/api/v2/alerts", timeout=10.0)
        if status != 200:
            raise ServiceError(f"Alertmanager /api/v2/alerts: HTTP {status}: {body[:200]!r}")
        return json.loads(body)


def alertmanager_config(
    webhook_url: str, group_wait: str = "1s", group_interval: str = "1s"
) -> dict[str, Any]:
    """An alertmanager.yml as a dict: every alert, grouped by name, to one webhook, resolutions included."""
    return {
        "route": {
            "receiver": "webhook",
            "group_by": ["alertname"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


@contextmanager
def start_alertmanager(
    webhook_url: str,
    *,
    group_wait: str = "1s",
    group_interval: str = "1s",
    workdir: Path | None = None,
    timeout: float = 60.0,
) -> Iterator[Alertmanager]:
    """A real Alertmanager on a free loopback port, clustering off, routing to ``webhook_url``."""
    binary = require_binary("prometheus-alertmanager")
    with _workdir(workdir) as work:
        config_path = work / "alertmanager.yml"
        config = alertmanager_config(webhook_url, group_wait, group_interval)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port = free_port()
        cmd = [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={work / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            # An empty address turns the gossip cluster off: one instance, no port 9094 to collide on.
            "--cluster.listen-address=",
        ]
        address = f"127.0.0.1:{port}"
        url = f"http://{address}"
        with start_process(cmd, f"{url}/-/ready", timeout, log_path=work / "alertmanager.log") as proc:
            yield Alertmanager(url, address, proc)


# ------------------------------------------------------- sharded agents, VictoriaMetrics and vmalert


def hashmod_shard(value: str, modulus: int) -> int:
    """The shard Prometheus's ``hashmod`` relabelling puts ``value`` in: the MD5 of the value, its last 8
    bytes read as a big-endian integer, modulo ``modulus`` (prometheus/model/relabel, the same since 1.x)."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def agent_config(
    targets: Mapping[str, Sequence[str]],
    remote_write_url: str,
    *,
    shard: int,
    shards: int,
    interval: str = "1s",
) -> dict[str, Any]:
    """A prometheus.yml for an agent: every job of ``targets`` (job name -> ``host:port`` list), of which
    the agent keeps the targets whose address hashes to ``shard`` of ``shards``, and a remote write of
    everything it scrapes to ``remote_write_url``. Every agent gets the same target list; the shard index
    is the one difference between their files."""
    shard_relabelling = [
        {
            "source_labels": ["__address__"],
            "modulus": shards,
            "target_label": "__tmp_hash",
            "action": "hashmod",
        },
        {"source_labels": ["__tmp_hash"], "regex": str(shard), "action": "keep"},
    ]
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": list(addrs)}],
                "relabel_configs": shard_relabelling,
            }
            for job, addrs in targets.items()
        ],
        "remote_write": [
            {
                "url": remote_write_url,
                # Batches leave within one scrape interval (the default waits up to 5 s).
                "queue_config": {"batch_send_deadline": interval},
            }
        ],
    }


@contextmanager
def start_prometheus_agent(
    targets: Mapping[str, Sequence[str]],
    remote_write_url: str,
    *,
    shard: int,
    shards: int,
    interval: str = "1s",
    workdir: Path | None = None,
    timeout: float = 60.0,
) -> Iterator[Prometheus]:
    """A real Prometheus in agent mode (``--enable-feature=agent``: scrape and remote-write, no local
    queries, no rules) on a free loopback port, scraping shard ``shard`` of ``shards`` of ``targets``.
    The handle's :meth:`Prometheus.targets_up` and ``api("targets")`` work; its queries do not."""
    binary = require_binary("prometheus")
    with _workdir(workdir) as work:
        config_path = work / "prometheus-agent.yml"
        config = agent_config(targets, remote_write_url, shard=shard, shards=shards, interval=interval)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        port = free_port()
        cmd = [
            binary,
            "--enable-feature=agent",
            f"--config.file={config_path}",
            f"--storage.agent.path={work / 'wal'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        url = f"http://127.0.0.1:{port}"
        with start_process(cmd, f"{url}/-/ready", timeout, log_path=work / "prometheus-agent.log") as proc:
            yield Prometheus(url, proc)


class VictoriaMetrics(Prometheus):
    """Handle on a running single-node VictoriaMetrics: its Prometheus-compatible query API (the
    :class:`Prometheus` calls), and where agents and vmalert write (:attr:`remote_write_url`)."""

    @property
    def remote_write_url(self) -> str:
        return f"{self.url}/api/v1/write"


@contextmanager
def start_victoria_metrics(
    *, workdir: Path | None = None, latency_offset: str = "1s", timeout: float = 60.0
) -> Iterator[VictoriaMetrics]:
    """A real single-node VictoriaMetrics (Debian's ``victoria-metrics``) on a free loopback port, its
    data in ``workdir``, kept one day (its shortest retention).

    ``latency_offset`` is ``-search.latencyOffset``: VictoriaMetrics answers an instant query for "now"
    as of that long ago (30 s by default, for samples still in flight), which would hold every alert of a
    test back by 30 s.
    """
    binary = require_binary("victoria-metrics")
    with _workdir(workdir) as work:
        port = free_port()
        cmd = [
            binary,
            f"-storageDataPath={work / 'victoria-metrics-data'}",
            "-retentionPeriod=1d",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-search.latencyOffset={latency_offset}",
            "-loggerLevel=WARN",
        ]
        url = f"http://127.0.0.1:{port}"
        with start_process(cmd, f"{url}/health", timeout, log_path=work / "victoria-metrics.log") as proc:
            yield VictoriaMetrics(url, proc)


@dataclass
class VmAlert:
    """Handle on a running vmalert: its rule groups and alerts as it evaluates them."""

    url: str
    process: RunningProcess

    def _api(self, path: str) -> Any:
        status, body = http_get(f"{self.url}/api/v1/{path}", timeout=10.0)
        if status != 200:
            raise ServiceError(f"vmalert /api/v1/{path}: HTTP {status}: {body[:200]!r}")
        return json.loads(body)["data"]

    def rule_groups(self) -> list[dict[str, Any]]:
        """Loaded groups with their rules (``type`` alerting or recording, ``lastError``, ...)."""
        return self._api("rules")["groups"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (``state`` pending or firing) with their labels."""
        return self._api("alerts")["alerts"] or []  # null when there is none


VMALERT_FLAGS = (
    # Alerts carry the labels Prometheus would give them: vmalert adds `alertgroup` (the rule group's
    # name) unless told not to, which would change every alert's identity in Alertmanager.
    "-disableAlertgroupLabel",
)


@contextmanager
def start_vmalert(
    rule_files: Sequence[Path],
    victoria_metrics: str,
    *,
    alertmanager: str,
    interval: str = "1s",
    workdir: Path | None = None,
    timeout: float = 60.0,
) -> Iterator[VmAlert]:
    """A real ``vmalert`` on a free loopback port evaluating ``rule_files`` every ``interval`` against the
    VictoriaMetrics at ``victoria_metrics`` (its base URL), writing recording rules' results and alert
    state back into it, restoring alert state from it, and notifying the Alertmanager at ``alertmanager``
    (its base URL)."""
    binary = require_binary("vmalert")
    with _workdir(workdir) as work:
        port = free_port()
        cmd = [
            binary,
            *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={victoria_metrics}",
            f"-remoteWrite.url={victoria_metrics}",
            f"-remoteRead.url={victoria_metrics}",
            f"-notifier.url={alertmanager}",
            f"-evaluationInterval={interval}",
            # Recording rules' results reach VictoriaMetrics within one evaluation (default 5 s).
            f"-remoteWrite.flushInterval={interval}",
            f"-httpListenAddr=127.0.0.1:{port}",
            *VMALERT_FLAGS,
            "-loggerLevel=WARN",
        ]
        url = f"http://127.0.0.1:{port}"
        with start_process(cmd, f"{url}/health", timeout, log_path=work / "vmalert.log") as proc:
            yield VmAlert(url, proc)


# ------------------------------------------------------------------------------------ inferwatch processes


@contextmanager
def start_demo(
    port: int | None = None,
    *,
    model: str = "tiny-llama",
    duration: float = 120.0,
    step_sleep: float = 0.0,
    max_new_tokens: int = 8,
    request_interval: float = 0.0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    workdir: Path | None = None,
    timeout: float = 120.0,
) -> Iterator[tuple[RunningProcess, str]]:
    """``inferwatch demo`` serving ``model`` on loopback; yields the process and its ``host:port``."""
    port = port or free_port()
    cmd = [
        require_binary("inferwatch"),
        "demo",
        f"--model={model}",
        f"--port={port}",
        "--addr=127.0.0.1",
        f"--duration={duration}",
        f"--step-sleep={step_sleep}",
        f"--max-new-tokens={max_new_tokens}",
        f"--request-interval={request_interval}",
        *extra_args,
    ]
    address = f"127.0.0.1:{port}"
    with (
        _workdir(workdir) as work,
        start_process(
            cmd, f"http://{address}/metrics", timeout, env=env, log_path=work / f"demo-{port}.log"
        ) as proc,
    ):
        yield proc, address


@contextmanager
def start_exporter(
    port: int | None = None,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    workdir: Path | None = None,
    timeout: float = 60.0,
) -> Iterator[tuple[RunningProcess, str]]:
    """``inferwatch-exporter`` on loopback; yields the process and its ``host:port``.

    ``env`` reaches the exporter, e.g. to select a fault-injecting NVML stand-in.
    """
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    cmd = [require_binary("inferwatch-exporter"), f"--web.listen-address={address}", *extra_args]
    with (
        _workdir(workdir) as work,
        start_process(
            cmd, f"http://{address}/metrics", timeout, env=env, log_path=work / f"exporter-{port}.log"
        ) as proc,
    ):
        yield proc, address
