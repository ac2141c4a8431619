"""What reads a paged KV cache (continuous batching), against a real Prometheus: the KV-cache alerts as
Prometheus evaluates them, ``inferwatch diagnose --prometheus`` and ``inferwatch top --once``.

The serving process is a prometheus_client registry served over HTTP from this process, with the series
the instrumentation of continuous batching exposes (docs/metrics.md): model ``cb`` has requests holding
950 of its 1000 blocks and its prefix cache keeping 20, and its scheduler preempts a request every half
second; model ``cached`` has requests holding 300 blocks and its prefix cache keeping 650 (blocks the
scheduler gives to requests that need room: not a full cache); model ``gen`` is served by generate (no
blocks, a preemption counter at zero). Every expected figure follows from those values.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from inferwatch.alerts.config import merge_config
from inferwatch.alerts.render import rules_yaml
from inferwatch.instrumentation.endpoint.server import start_http_server
from inferwatch.monitor import checklist
from tests.support.services import Prometheus, run_inferwatch, start_prometheus, wait_until

pytestmark = pytest.mark.integration

SERVING_JOB = "llm-serving"  # the job the rules select (alerts/config.yaml: selectors.serving)
PREEMPTIONS_PER_SECOND = 2.0
# The two KV-cache alerts with a `for:` and a window that a test can wait out.
FAST_ALERTS = {
    "InferwatchKvCacheNearlyFull": {"for": "3s"},
    "InferwatchKvCachePreemptions": {"for": "3s", "window": "10s"},
}
DIAGNOSE_WINDOW = ("--window", "6s", "--step", "2s", "--rate-window", "4s")


@pytest.fixture(scope="module")
def serving() -> Iterator[str]:
    """The serving process's endpoint (``host:port``); ``cb`` preempts until the module ends."""
    r = CollectorRegistry()
    info = Gauge("llm_model_info", "", ["model", "device"], registry=r)
    blocks = Gauge("llm_kv_cache_blocks", "", ["model", "state"], registry=r)
    headroom = Gauge("llm_kv_cache_headroom_tokens", "", ["model"], registry=r)
    preemptions = Counter("llm_kv_cache_preemptions", "", ["model"], registry=r)
    for model in ("cb", "cached", "gen"):
        info.labels(model, "cpu").set(1)
        preemptions.labels(model)
    for model, used, prefix_cached in (("cb", 950, 20), ("cached", 300, 650)):
        blocks.labels(model, "used").set(used)
        blocks.labels(model, "prefix_cached").set(prefix_cached)
        blocks.labels(model, "total").set(1000)
        headroom.labels(model).set((1000 - used) * 16)  # free and prefix-cached blocks of 16 tokens
    headroom.labels("gen").set(50000)
    stop = threading.Event()

    def preempt() -> None:
        while not stop.wait(1 / PREEMPTIONS_PER_SECOND):
            preemptions.labels("cb").inc()

    server = start_http_server(port=0, addr="127.0.0.1", registry=r)
    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.fixture(scope="module")
def prometheus(serving: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("paged-kv-cache")
    rules = workdir / "rules.yaml"
    rules.write_text(rules_yaml(merge_config({"alerts": FAST_ALERTS})))
    with start_prometheus({SERVING_JOB: [serving]}, [rules], workdir=workdir / "prometheus") as running:
        running.wait_for_targets_up(60)
        yield running


def firing(prometheus: Prometheus) -> set[tuple[str, str]]:
    return {
        (alert["labels"]["alertname"], alert["labels"].get("model", ""))
        for alert in prometheus.alerts()
        if alert["state"] == "firing"
    }


def test_the_kv_cache_alerts_fire_for_the_paged_cache_only(prometheus: Prometheus, serving: str) -> None:
    wanted = {("InferwatchKvCacheNearlyFull", "cb"), ("InferwatchKvCachePreemptions", "cb")}
    wait_until(
        lambda: wanted <= firing(prometheus), 60, lambda: f"{wanted} firing (got {firing(prometheus)})"
    )
    # The model served by generate has no blocks and no preemptions, and the prefix cache of ``cached``
    # is no full cache: neither alert for them, not even pending.
    assert [a for a in prometheus.alerts() if a["labels"].get("model") in ("gen", "cached")] == []
    (nearly_full,) = [
        a for a in prometheus.alerts() if a["labels"]["alertname"] == "InferwatchKvCacheNearlyFull"
    ]
    assert (
        nearly_full["annotations"]["summary"] == f"The paged KV cache of model cb on {serving} is 95% full."
    )


def test_diagnose_reports_the_full_and_preempting_cache(prometheus: Prometheus, serving: str) -> None:
    prometheus.wait_for_history('llm_kv_cache_blocks{state="used"}', 12)
    result = run_inferwatch("diagnose", "--prometheus", prometheus.url, *DIAGNOSE_WINDOW, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    kv = [f for f in report["findings"] if f["check"] == "kv-cache"]
    assert [f["subject"] for f in kv] == [f"model cb on {serving}"]
    (finding,) = kv
    assert finding["summary"].startswith("the paged KV cache is 95% full and the scheduler preempts")
    evidence: dict[str, Any] = {e["what"]: e for e in finding["evidence"]}
    assert evidence["KV-cache blocks used (mean; now)"]["value"] == "95%; 95%"
    preempted = float(evidence["requests preempted per second (mean)"]["value"])
    assert preempted == pytest.approx(PREEMPTIONS_PER_SECOND, rel=0.35)
    assert evidence["KV-cache headroom (tokens, now)"]["value"] == "800"
    actions = [item["action"] for item in finding["checklist"]]
    assert actions[0] == checklist.KV_BLOCKS.action and actions[-1] == checklist.CPU_OFFLOAD.action
    # The headroom under InferwatchKvCacheHeadroomLow's 4096 tokens is an oom-risk finding too, whose
    # remedies are the paged cache's: the model has one (its blocks series says so).
    (oom,) = [f for f in report["findings"] if f["check"] == "oom-risk"]
    assert oom["subject"] == f"model cb on {serving}"
    assert [item["action"] for item in oom["checklist"]] == actions[:-1]


def test_top_shows_the_blocks_and_the_preemptions(serving: str) -> None:
    result = run_inferwatch("top", "--once", "--json", "--window", "2", serving)
    assert result.returncode == 0, result.stderr
    models = {row["model"]: row for row in json.loads(result.stdout)["models"]}
    assert models["cb"]["kv_blocks_used_ratio"] == 0.95
    assert models["cached"]["kv_blocks_used_ratio"] == 0.3
    assert models["cb"]["kv_preemptions_per_second"] == pytest.approx(PREEMPTIONS_PER_SECOND, rel=0.6)
    assert models["gen"]["kv_blocks_used_ratio"] is None
    assert models["gen"]["kv_preemptions_per_second"] == 0.0
    text = run_inferwatch("top", "--once", "--window", "1", serving).stdout
    assert "KV blocks used" in text and "95%" in text
