"""The rules and dashboards against live systems: a real Prometheus scraping a real instrumented demo and
a real inferwatch-exporter, and a real Alertmanager routing to a webhook this test runs.

* every expression of every dashboard panel (template variables substituted) and every recording rule
  returns at least one series, every rule evaluates without error, and every selector of every alert
  finds series: a typo in a metric name, a label value or a join fails here;
* one alert end to end: rendered through the configuration with a tiny threshold and `for:`, driven by a
  host-bound serving process on a GPU, delivered by Alertmanager to the webhook with its labels, then
  resolved once the process keeps its GPU busy;
* the configuration rendering refuses bad input.

The machine has no GPU: the exporter runs over the fault-injecting NVML stand-in the exporter's own tests
use (tests/support/fake_nvml.py, selected by INFERWATCH_EXPORTER_NVML_MODULE), so every ``gpu_*``
series is real exporter output. The series docs/metrics.md marks *CUDA only* (torch's CUDA allocator)
cannot exist on a CPU demo, nor on a demo that calls generate itself the blocks of a paged KV cache
(continuous batching), what a server behind the middleware sent, or a draft model's tokens; expressions
that read them are listed and must still parse. The GPU busy ratio, CUDA
only too, comes from a second serving target: the endpoint of a serving process on a GPU
(tests/support/gpu_serving.py), whose series are the ones an instrumented process on the H200 showed.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from tests.support import METRICS_DOC, PACKAGE_ROOT, REPO_ROOT
from tests.support.gpu_serving import GPU_BOUND_BUSY, GpuServing, gpu_serving
from tests.support.promql import metric_names
from tests.support.services import (
    Alertmanager,
    Prometheus,
    RunningProcess,
    ServiceError,
    WebhookReceiver,
    require_binary,
    start_alertmanager,
    start_demo,
    start_exporter,
    start_prometheus,
    start_webhook_receiver,
    wait_until,
)

pytestmark = pytest.mark.integration

SERVING_JOB = "llm-serving"
EXPORTER_JOB = "inferwatch-exporter"
MODEL = "tiny-llama"
# What Grafana would put in place of the template variables with "All" selected.
VARIABLES = {'"$model"': '".+"', '"$instance"': '".+"', '"$gpu"': '".+"', "$__rate_interval": "15s"}
# Series created at their first event, which a healthy demo never has: expressions reading them must
# parse, but cannot return data.
EVENT_ONLY = {"llm_instrumentation_errors_total": "the instrumentation caught no error"}
# Series a demo that serves through generate, with no HTTP server and no draft model, cannot have.
PAGED_CACHE = "only continuous batching has a paged KV cache"
MIDDLEWARE = "only a server behind the middleware sends responses (test_http_edge.py checks them)"
SPECULATION = "only a model that speculates has draft tokens (test_speculative.py checks them)"
ONLY_ELSEWHERE = {
    "llm_kv_cache_blocks": PAGED_CACHE,
    "llm_response_time_to_first_content_seconds_bucket": MIDDLEWARE,
    "llm_response_time_to_first_content_seconds_sum": MIDDLEWARE,
    "llm_response_time_to_first_content_seconds_count": MIDDLEWARE,
    "llm_response_time_to_last_byte_seconds_bucket": MIDDLEWARE,
    "llm_spec_decode_draft_tokens_total": SPECULATION,
    "llm_spec_decode_accepted_tokens_total": SPECULATION,
}

# The alert driven end to end, with a `for:` and a window a test can wait out: the GPU serving target runs
# its GPU 11 % of the time (host-bound), then 95 %.
HOST_BOUND = "InferwatchHostBound"
HOST_BOUND_CONFIG = {"busy_ratio_below": 0.4, "for": "3s", "window": "10s", "requests_running_above": 0.5}
# CUDA-only series that the GPU serving target has.
GPU_SERVED = {"llm_gpu_busy_ratio"}
DEMO_ENV = {
    # Forward-time and utilization windows of one second instead of five.
    "INFERWATCH_POLL_INTERVAL_SECONDS": "1",
    # A CPU has no NVML-reported peaks; made-up ones make the utilization series exist.
    "INFERWATCH_PEAK_MEMORY_BANDWIDTH_BYTES_PER_SECOND": "2e10",
    "INFERWATCH_PEAK_FLOPS": "1e11",
}
DEMO_ARGS = {"model": MODEL, "duration": 600.0, "max_new_tokens": 16}


def cuda_only_metrics() -> set[str]:
    """Metrics docs/metrics.md marks *CUDA only*."""
    rows = re.findall(r"^\|\s*`([a-z_:]+)`\s*\|.*\*CUDA only\.\*", METRICS_DOC.read_text(), re.MULTILINE)
    return set(rows)


@dataclass
class Stack:
    """The running services."""

    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    exporter: tuple[RunningProcess, str]
    gpu_serving: GpuServing


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("live")
    rules = workdir / "rules.yaml"
    rules.write_text(rules_yaml(merge_config({"alerts": {HOST_BOUND: HOST_BOUND_CONFIG}})))
    fake_nvml = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": 2, "processes": {"0": [[4242, 1 << 30]]}}),
        "FAKE_NVML_CONTROL": str(workdir / "nvml-control.jsonl"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with ExitStack() as services:
        webhook = services.enter_context(start_webhook_receiver())
        alertmanager = services.enter_context(
            start_alertmanager(webhook.url, workdir=workdir / "alertmanager")
        )
        demo, demo_address = services.enter_context(start_demo(**DEMO_ARGS, env=DEMO_ENV, workdir=workdir))
        on_gpu = services.enter_context(gpu_serving(MODEL))
        pid_file = workdir / "demo.pid"
        pid_file.write_text(str(demo.popen.pid))
        exporter = services.enter_context(
            start_exporter(
                extra_args=[
                    "--collector.interval=500ms",
                    "--collector.pcie_throughput",
                    f"--processes.pid-file={pid_file}",
                ],
                env=fake_nvml,
                workdir=workdir,
            )
        )
        # One XID event and one NVML call hanging for a moment, so that the XID and NVML-error series
        # exist (the exporter creates each at its first event).
        faults = [
            {"op": "xid", "gpu": 0, "xid": 79},
            {"op": "hang", "gpu": 1, "call": "nvmlDeviceGetPowerUsage", "seconds": 2},
        ]
        (workdir / "nvml-control.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
        prometheus = services.enter_context(
            start_prometheus(
                {SERVING_JOB: [demo_address, on_gpu.address], EXPORTER_JOB: [exporter[1]]},
                [rules],
                alertmanager=alertmanager.address,
                workdir=workdir / "prometheus",
            )
        )
        prometheus.wait_for_targets_up(60)
        yield Stack(prometheus, alertmanager, webhook, exporter, on_gpu)


def substitute(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def dashboard_expressions() -> list[tuple[str, str]]:
    found = []
    for path in sorted((PACKAGE_ROOT / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']}", substitute(target["expr"])))
    return found


def cannot_have_data(expr: str) -> str | None:
    """Why ``expr`` cannot return data on this machine, or None when it must."""
    names = metric_names(expr)
    cuda = names & cuda_only_metrics() - GPU_SERVED
    if cuda:
        return f"CUDA only: {', '.join(sorted(cuda))}"
    events = {name for name in names if name in EVENT_ONLY}
    if events:
        return "; ".join(EVENT_ONLY[name] for name in sorted(events))
    elsewhere = sorted({ONLY_ELSEWHERE[name] for name in names if name in ONLY_ELSEWHERE})
    return "; ".join(elsewhere) if elsewhere else None


def wait_for_data(prometheus: Prometheus, expressions: list[tuple[str, str]]) -> list[str]:
    """Poll until every expression that can have data returns a series; return those that never did."""
    pending = {expr: where for where, expr in expressions if cannot_have_data(expr) is None}

    def all_answered() -> bool:
        for expr in list(pending):
            if prometheus.query(expr):
                del pending[expr]
        return not pending

    try:
        wait_until(all_answered, 90, "every expression to return data", interval=1.0)
    except ServiceError:
        return [f"{where}: {expr}" for expr, where in pending.items()]
    return []


def test_every_dashboard_expression_returns_data(stack: Stack) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) > 50
    assert wait_for_data(stack.prometheus, expressions) == []
    excused = [(where, reason) for where, expr in expressions if (reason := cannot_have_data(expr))]
    for _, expr in expressions:
        stack.prometheus.query(expr)  # parses and evaluates (raises PromQLError otherwise)
    # Only what docs/metrics.md calls CUDA-only, the instrumentation's error counter, and what only
    # another way of serving has (ONLY_ELSEWHERE) are excused.
    assert {where for where, _ in excused} == {
        "inferwatch-overview.json: Allocator memory",
        "inferwatch-overview.json: KV-cache blocks used",
        "inferwatch-overview.json: First token sampled vs first content sent",
        "inferwatch-overview.json: Speculative decoding acceptance",
        "inferwatch-diagnosis.json: Allocator memory",
        "inferwatch-diagnosis.json: Allocator retries and OOMs",
        "inferwatch-diagnosis.json: KV-cache blocks used",
        "inferwatch-diagnosis.json: NVML and instrumentation errors",
    }, excused


def test_dashboard_variables_find_values(stack: Stack) -> None:
    for path in sorted((PACKAGE_ROOT / "dashboards").glob("*.json")):
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
            assert match, variable["query"]
            series = stack.prometheus.wait_for_series(substitute(match[1]))
            assert all(match[2] in s["metric"] for s in series), (path.name, variable["name"])


def test_every_recording_rule_returns_data_and_every_rule_evaluates(stack: Stack) -> None:
    groups = stack.prometheus.rule_groups()
    recorded = sorted({rule["name"] for g in groups for rule in g["rules"] if rule["type"] == "recording"})
    assert len(recorded) >= 5
    assert wait_for_data(stack.prometheus, [("recording rule", name) for name in recorded]) == []

    def every_rule_evaluated() -> bool:
        return all(rule["health"] == "ok" for g in stack.prometheus.rule_groups() for rule in g["rules"])

    wait_until(every_rule_evaluated, 30, "every rule to evaluate")
    for group in stack.prometheus.rule_groups():
        for rule in group["rules"]:
            assert rule["health"] == "ok" and not rule.get("lastError"), (rule["name"], rule.get("lastError"))


def test_every_series_the_alerts_select_exists(stack: Stack) -> None:
    """Label values are right too: each selector of each alert, as written, finds series (a misspelt
    ``reason`` or ``clock`` would make an alert that can never fire)."""
    selectors = set()
    for group in stack.prometheus.rule_groups():
        for rule in group["rules"]:
            if rule["type"] == "alerting":
                selectors |= set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}", rule["query"]))
    missing = [s for s in sorted(selectors) if cannot_have_data(s) is None and not stack.prometheus.query(s)]
    assert missing == []


def test_host_bound_alert_fires_and_resolves_through_alertmanager(stack: Stack) -> None:
    firing = stack.webhook.wait_for_alert(HOST_BOUND, "firing", timeout=90)
    # Only the process on the GPU: the CPU demo has no busy ratio to be low.
    assert firing["labels"] == {
        "alertname": HOST_BOUND,
        "severity": "warning",
        "job": SERVING_JOB,
        "instance": stack.gpu_serving.address,
        "model": MODEL,
        "device": "cuda:0",
        "uuid": stack.gpu_serving.device.uuid,
        "source": "process",
    }
    assert firing["annotations"]["runbook_url"].endswith("#inferwatchhostbound")
    assert f"model {MODEL} on {stack.gpu_serving.address}" in firing["annotations"]["summary"]
    assert "11%" in firing["annotations"]["summary"]
    assert "threshold 40%" in firing["annotations"]["description"]
    assert "process utilization" in firing["annotations"]["description"]

    before = len(stack.webhook.received())
    stack.gpu_serving.set_busy(GPU_BOUND_BUSY, forward_time=0.97)
    resolved = stack.webhook.wait_for_alert(HOST_BOUND, "resolved", timeout=90, since=before)
    assert resolved["labels"] == firing["labels"]
    # The process keeps its GPU busy above the threshold now, and after longer than the alert's window
    # and `for:` the alert is neither pending nor firing.
    busy = f'llm_gpu_busy_ratio{{job="{SERVING_JOB}", model="{MODEL}"}}'
    stack.prometheus.wait_for_series(f"min_over_time({busy}[15s]) >= 0.4 and {busy} offset 15s")
    assert not stack.prometheus.query(f'ALERTS{{alertname="{HOST_BOUND}"}}')
    notifications = [
        a["status"] for n in stack.webhook.received() for a in n["alerts"] if a["labels"] == firing["labels"]
    ]
    assert notifications[-1] == "resolved", notifications


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"alerts": {HOST_BOUND: {"busy_ratio": 0.4}}},
            "unknown key 'alerts.InferwatchHostBound.busy_ratio'",
        ),
        (
            {"alerts": {HOST_BOUND: {"busy_ratio_below": -0.4}}},
            "'alerts.InferwatchHostBound.busy_ratio_below' must not be negative",
        ),
    ],
)
def test_rendering_refuses_bad_configuration(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [
            require_binary("inferwatch"),
            "alerts",
            "render",
            "--config",
            str(path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()
