"""Past one Prometheus (docs/deploy.md, "Past one Prometheus: sharded agents, VictoriaMetrics and
vmalert"), run for real: two Prometheus agents (``--enable-feature=agent``), each scraping its ``hashmod``
shard of the targets and remote-writing to a single-node VictoriaMetrics; ``vmalert`` evaluating the
rules inferwatch ships against it, writing the recording rules' results back into it and sending alerts
to a real Alertmanager, which delivers them to a webhook this test runs.

* each agent scrapes exactly its shard, the shards partition the targets, and every target's series
  reach VictoriaMetrics once;
* the rules load in vmalert unchanged and every rule evaluates there without error; every recording
  rule's result is written back into VictoriaMetrics by vmalert;
* ``InferwatchHostBound``, rendered through the configuration with a short ``for:`` as
  test_live_prometheus.py renders it, goes pending, then firing in vmalert, is recorded in
  VictoriaMetrics (``ALERTS``), is held by Alertmanager (``/api/v2/alerts``) and delivered to the webhook
  with the labels Prometheus gives it, then resolves once the process keeps its GPU busy.

The targets are real inferwatch endpoints: two ``inferwatch-exporter`` processes over the NVML stand-in
(tests/support/fake_nvml.py) and two instrumentation endpoints of serving processes on a GPU
(tests/support/gpu_serving.py), one host-bound and one GPU-bound, whose histograms this test feeds so
that every recording rule has an input.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from inferwatch.instrumentation.metrics import catalogue as cat
from tests.support import REPO_ROOT, free_port
from tests.support.gpu_serving import (
    GPU_BOUND_BUSY,
    HOST_BOUND_BUSY,
    HOST_BOUND_FORWARD_TIME,
    GpuServing,
    gpu_serving,
)
from tests.support.services import (
    Alertmanager,
    Prometheus,
    RunningProcess,
    VictoriaMetrics,
    VmAlert,
    WebhookReceiver,
    hashmod_shard,
    start_alertmanager,
    start_exporter,
    start_prometheus_agent,
    start_victoria_metrics,
    start_vmalert,
    start_webhook_receiver,
    wait_until,
)

pytestmark = pytest.mark.integration

SHARDS = 2
SERVING_JOB = "llm-serving"
EXPORTER_JOB = "inferwatch-exporter"
MODEL = "tiny-llama"
HOST_BOUND = "InferwatchHostBound"
# As test_live_prometheus.py: a `for:` and a window a test can wait out.
HOST_BOUND_CONFIG = {"busy_ratio_below": 0.4, "for": "3s", "window": "10s", "requests_running_above": 0.5}
# What the serving endpoints observe, ten times a second, so that every histogram a recording rule reads
# has a rate: seconds, all under the SLO targets (1 s TTFT, 100 ms inter-token).
OBSERVATIONS = {cat.TTFT: 0.2, cat.ITL: 0.02, cat.QUEUE: 0.05, cat.E2E: 0.5}
#: The labels beside ``model`` of the families that have more (end-to-end latency: served requests').
EXTRA_LABELS = {cat.E2E: ("ok",)}


@dataclass
class Fleet:
    """The running services."""

    agents: list[Prometheus]
    victoria_metrics: VictoriaMetrics
    vmalert: VmAlert
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    host_bound: GpuServing
    gpu_bound: GpuServing
    exporters: list[tuple[RunningProcess, str]]
    rules: Path

    @property
    def targets(self) -> dict[str, list[str]]:
        return {
            SERVING_JOB: [self.host_bound.address, self.gpu_bound.address],
            EXPORTER_JOB: [address for _, address in self.exporters],
        }


def ports_one_per_shard() -> list[int]:
    """A free port for each shard, whose loopback address hashes to that shard: whatever addresses the
    serving endpoints get, every agent has a target."""
    found: dict[int, int] = {}
    while len(found) < SHARDS:
        port = free_port()
        found.setdefault(hashmod_shard(f"127.0.0.1:{port}", SHARDS), port)
    return [found[shard] for shard in range(SHARDS)]


def observe(servings: list[GpuServing], stop: threading.Event) -> None:
    while not stop.wait(0.1):
        for serving in servings:
            for spec, seconds in OBSERVATIONS.items():
                serving.metrics[spec].labels(serving.model, *EXTRA_LABELS.get(spec, ())).observe(seconds)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("fleet")
    # The rules file the project ships, rendered with the alert's short `for:` the way the Prometheus
    # tests render it; nothing else in it changes.
    rules = workdir / "rules.yaml"
    rules.write_text(rules_yaml(merge_config({"alerts": {HOST_BOUND: HOST_BOUND_CONFIG}})))
    fake_nvml = {
        "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
        "FAKE_NVML_SCENARIO": json.dumps({"gpus": 1}),
        "PYTHONPATH": str(REPO_ROOT),
    }
    stop = threading.Event()
    with ExitStack() as services:
        webhook = services.enter_context(start_webhook_receiver())
        alertmanager = services.enter_context(
            start_alertmanager(webhook.url, workdir=workdir / "alertmanager")
        )
        victoria_metrics = services.enter_context(
            start_victoria_metrics(workdir=workdir / "victoria-metrics")
        )
        exporters = [
            services.enter_context(
                start_exporter(
                    port, extra_args=["--collector.interval=500ms"], env=fake_nvml, workdir=workdir
                )
            )
            for port in ports_one_per_shard()
        ]
        # Both keep their GPU busy until the alert's test makes one host-bound.
        host_bound = services.enter_context(gpu_serving(MODEL))
        gpu_bound = services.enter_context(gpu_serving(MODEL))
        for serving in (host_bound, gpu_bound):
            serving.set_busy(GPU_BOUND_BUSY, forward_time=0.97)
        observer = threading.Thread(target=observe, args=([host_bound, gpu_bound], stop), daemon=True)
        observer.start()
        services.callback(observer.join)
        services.callback(stop.set)
        targets = {
            SERVING_JOB: [host_bound.address, gpu_bound.address],
            EXPORTER_JOB: [address for _, address in exporters],
        }
        agents = [
            services.enter_context(
                start_prometheus_agent(
                    targets,
                    victoria_metrics.remote_write_url,
                    shard=shard,
                    shards=SHARDS,
                    workdir=workdir / f"agent-{shard}",
                )
            )
            for shard in range(SHARDS)
        ]
        vmalert = services.enter_context(
            start_vmalert([rules], victoria_metrics.url, alertmanager=alertmanager.url, workdir=workdir)
        )
        yield Fleet(
            agents, victoria_metrics, vmalert, alertmanager, webhook, host_bound, gpu_bound, exporters, rules
        )


def scraped(agent: Prometheus, targets: int) -> set[str]:
    """The ``host:port`` of every target the agent scrapes, once it has placed all ``targets`` (kept or
    dropped by its relabelling)."""

    def placed() -> dict[str, Any] | None:
        answer = agent.api("targets")
        return answer if len(answer["activeTargets"]) + len(answer["droppedTargets"]) == targets else None

    answer = wait_until(placed, 30, f"{agent.url} to place its {targets} targets")
    return {t["labels"]["instance"] for t in answer["activeTargets"]}


def test_each_agent_scrapes_only_its_shard_and_every_target_is_in_one(fleet: Fleet) -> None:
    every_target = {address for addresses in fleet.targets.values() for address in addresses}
    assert len(every_target) == 4
    shards = [scraped(agent, len(every_target)) for agent in fleet.agents]
    for shard, (agent, addresses) in enumerate(zip(fleet.agents, shards, strict=True)):
        # hashmod over the address, as Prometheus computes it, predicts the split; none is empty.
        assert addresses == {a for a in every_target if hashmod_shard(a, SHARDS) == shard}, shard
        assert addresses, f"shard {shard} has no target"
        dropped = {t["discoveredLabels"]["__address__"] for t in agent.api("targets")["droppedTargets"]}
        assert dropped == every_target - addresses, shard
        agent.wait_for_targets_up(60)
    assert set().union(*shards) == every_target
    assert sum(len(s) for s in shards) == len(every_target), "a target is in two shards"


def test_agents_answer_no_queries(fleet: Fleet) -> None:
    """Agent mode: the agents keep no queryable database; the queries go to VictoriaMetrics."""
    for agent in fleet.agents:
        with pytest.raises(Exception, match="unavailable with Prometheus Agent"):
            agent.query("up")


def test_every_target_s_series_reach_victoriametrics_once(fleet: Fleet) -> None:
    vm = fleet.victoria_metrics
    for job, addresses in fleet.targets.items():
        for address in addresses:
            up = vm.wait_for_series(f'up{{job="{job}", instance="{address}"}} == 1', timeout=60)
            assert len(up) == 1, up
    # Each scraped by one agent only: one series per target, its samples one per scrape interval.
    wait_until(
        lambda: len(vm.query("up")) == 4 and not vm.query("count by (job, instance) (up) > 1"),
        30,
        lambda: f"one up series per target (got {vm.query('up')})",
    )
    per_second = vm.query("max(count_over_time(up[10s]))")
    assert float(per_second[0]["value"][1]) <= 11, per_second
    # The inferwatch series themselves: the exporters' GPUs and the serving endpoints' models.
    gpus = vm.wait_for_series(f'gpu_info{{job="{EXPORTER_JOB}"}}')
    assert {s["metric"]["instance"] for s in gpus} == set(fleet.targets[EXPORTER_JOB])
    models = vm.wait_for_series(f'llm_model_info{{job="{SERVING_JOB}"}}')
    assert {s["metric"]["instance"] for s in models} == set(fleet.targets[SERVING_JOB])


def rule_names(path: Path, kind: str) -> set[str]:
    groups = yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    return {rule[kind] for group in groups for rule in group["rules"] if kind in rule}


def test_the_shipped_rules_load_unchanged_and_every_rule_evaluates(fleet: Fleet) -> None:
    loaded = fleet.vmalert.rule_groups()
    shipped = yaml.safe_load(fleet.rules.read_text(encoding="utf-8"))["groups"]
    assert {g["name"] for g in loaded} == {g["name"] for g in shipped}
    assert {r["name"] for g in loaded for r in g["rules"]} == rule_names(fleet.rules, "alert") | rule_names(
        fleet.rules, "record"
    )
    assert sum(len(g["rules"]) for g in loaded) == sum(len(g["rules"]) for g in shipped)

    def every_rule_evaluated() -> bool:
        rules = [r for g in fleet.vmalert.rule_groups() for r in g["rules"]]
        return all(r["lastEvaluation"] and not r["lastEvaluation"].startswith("0001") for r in rules)

    wait_until(every_rule_evaluated, 30, "every rule to be evaluated")
    errors = {
        r["name"]: r["lastError"] for g in fleet.vmalert.rule_groups() for r in g["rules"] if r["lastError"]
    }
    assert errors == {}


def test_recording_rules_results_are_written_back_into_victoriametrics(fleet: Fleet) -> None:
    recorded = rule_names(fleet.rules, "record")
    assert len(recorded) >= 10
    vm = fleet.victoria_metrics
    pending = set(recorded)

    def all_written() -> bool:
        for name in list(pending):
            if vm.query(name):
                pending.discard(name)
        return not pending

    wait_until(
        all_written, 90, lambda: f"every recording rule's series in VictoriaMetrics (missing: {pending})"
    )
    # The bucket rates of both serving endpoints, whichever agent scraped them, summed per job and model:
    # one series per bucket bound, and the quantile read from it, one series per model.
    raw = vm.query("count(llm_time_to_first_token_seconds_bucket) by (instance)")
    assert {s["metric"]["instance"] for s in raw} == set(fleet.targets[SERVING_JOB])
    buckets = vm.query("job_model:llm_time_to_first_token_seconds_bucket:rate5m")
    first = fleet.targets[SERVING_JOB][0]
    bounds = vm.query(f'count(llm_time_to_first_token_seconds_bucket{{instance="{first}"}}) by (le)')
    assert sorted(s["metric"]["le"] for s in buckets) == sorted(s["metric"]["le"] for s in bounds)
    ttft = vm.query('job_model:llm_time_to_first_token_seconds:quantile_rate5m{quantile="0.5"}')
    assert [(s["metric"]["job"], s["metric"]["model"], "instance" in s["metric"]) for s in ttft] == [
        (SERVING_JOB, MODEL, False)
    ]
    ratio = vm.query("job_model:llm_time_to_first_token_seconds:slo_error_ratio_rate5m")
    assert [float(s["value"][1]) for s in ratio] == [0.0], ratio


def host_bound_alert(vmalert: VmAlert) -> dict[str, Any] | None:
    return next((a for a in vmalert.alerts() if a["name"] == HOST_BOUND), None)


def test_host_bound_alert_goes_pending_firing_to_alertmanager_and_resolves(fleet: Fleet) -> None:
    # Nothing is host-bound yet; the rule has been evaluated on data from both serving endpoints.
    fleet.victoria_metrics.wait_for_series(f'llm_gpu_busy_ratio{{job="{SERVING_JOB}"}} > 0.9', timeout=60)
    assert host_bound_alert(fleet.vmalert) is None
    fleet.host_bound.set_busy(HOST_BOUND_BUSY, HOST_BOUND_FORWARD_TIME)
    seen = []

    def firing() -> bool:
        alert = host_bound_alert(fleet.vmalert)
        if alert and (not seen or seen[-1] != alert["state"]):
            seen.append(alert["state"])
        return bool(alert) and alert["state"] == "firing"

    wait_until(firing, 120, lambda: f"{HOST_BOUND} firing in vmalert (states seen: {seen})", interval=0.2)
    # `for: 3s` holds it pending first.
    assert seen == ["pending", "firing"], seen
    expected = {
        "alertname": HOST_BOUND,
        "severity": "warning",
        "job": SERVING_JOB,
        "instance": fleet.host_bound.address,
        "model": MODEL,
        "device": "cuda:0",
        "uuid": fleet.host_bound.device.uuid,
        "source": "process",
    }
    # Labels as Prometheus gives them (no `alertgroup`: -disableAlertgroupLabel), only the host-bound one.
    assert [a["labels"] for a in fleet.vmalert.alerts() if a["name"] == HOST_BOUND] == [expected]
    state = fleet.victoria_metrics.wait_for_series(f'ALERTS{{alertname="{HOST_BOUND}", alertstate="firing"}}')
    assert state[0]["metric"]["instance"] == fleet.host_bound.address

    held = wait_until(
        lambda: [a for a in fleet.alertmanager.alerts() if a["labels"].get("alertname") == HOST_BOUND],
        60,
        f"{HOST_BOUND} in Alertmanager",
    )
    assert [a["labels"] for a in held] == [expected]
    assert held[0]["status"]["state"] == "active"
    assert re.search(r"only 11% of the time", held[0]["annotations"]["summary"])
    assert "threshold 40%" in held[0]["annotations"]["description"]
    notified = fleet.webhook.wait_for_alert(HOST_BOUND, "firing", timeout=60)
    assert notified["labels"] == expected

    before = len(fleet.webhook.received())
    fleet.host_bound.set_busy(GPU_BOUND_BUSY, forward_time=0.97)
    resolved = fleet.webhook.wait_for_alert(HOST_BOUND, "resolved", timeout=90, since=before)
    assert resolved["labels"] == expected
    wait_until(lambda: host_bound_alert(fleet.vmalert) is None, 30, f"{HOST_BOUND} inactive in vmalert")
    wait_until(
        lambda: not [a for a in fleet.alertmanager.alerts() if a["labels"].get("alertname") == HOST_BOUND],
        30,
        f"{HOST_BOUND} gone from Alertmanager's active alerts",
    )
