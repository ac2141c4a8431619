"""A real Alertmanager (``prometheus-alertmanager``) firing test alerts at the instrumentation endpoint's
webhook receiver: exactly one capture per alert group within the rate limit, however often the group is
notified, and resolutions take none."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch

from inferwatch.instrumentation import instrument
from inferwatch.instrumentation.demo.models import build_model
from inferwatch.instrumentation.endpoint.server import start_http_server
from tests.support import http_get
from tests.support.services import start_alertmanager, wait_until

pytestmark = pytest.mark.integration


def fire(alertmanager: str, alertname: str, instance: str, resolved: bool = False) -> None:
    now = datetime.now(timezone.utc)
    alert: dict[str, Any] = {
        "labels": {"alertname": alertname, "instance": instance, "severity": "warning"},
        "annotations": {"summary": "a test alert"},
        "startsAt": (now - timedelta(seconds=5)).isoformat(),
    }
    if resolved:
        alert["endsAt"] = now.isoformat()
    request = urllib.request.Request(
        f"{alertmanager}/api/v2/alerts",
        data=json.dumps([alert]).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """An instrumented model generating in a loop, and its endpoint with profiling on."""
    monkeypatch.setenv("INFERWATCH_PROFILE", "1")
    monkeypatch.setenv("INFERWATCH_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("INFERWATCH_PROFILE_ALERT_INTERVAL_SECONDS", "300")
    model = build_model("tiny-llama")
    handle = instrument(model)
    server = start_http_server(port=0)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            model.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=16, do_sample=False)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        yield server.url.removesuffix("/metrics")
    finally:
        stop.set()
        worker.join(timeout=60)
        server.close()
        handle.remove()


def captures(base: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{base}/debug/profile/list")
    assert status == 200, body
    return [c for c in json.loads(body) if c["requested_by"].startswith("alertmanager")]


def test_one_capture_per_alert_group_within_the_rate_limit(serving: str) -> None:
    webhook = f"{serving}/debug/alertmanager?steps=3&seconds=10"
    with start_alertmanager(webhook, group_wait="1s", group_interval="1s") as alertmanager:
        fire(alertmanager.url, "InferwatchHostBound", "serving-a")
        wait_until(lambda: len(captures(serving)) == 1, 60, lambda: f"one capture: {captures(serving)}")
        # The same group notified again (a new alert in it, then its resolution), and a second group.
        fire(alertmanager.url, "InferwatchHostBound", "serving-b")
        fire(alertmanager.url, "InferwatchTimeToFirstTokenHigh", "serving-a")
        wait_until(lambda: len(captures(serving)) == 2, 60, lambda: f"two captures: {captures(serving)}")
        fire(alertmanager.url, "InferwatchHostBound", "serving-a", resolved=True)
        time.sleep(5)  # several group intervals: every notification Alertmanager had to send is sent
        taken = captures(serving)
    groups = [c["requested_by"] for c in taken]
    assert len(groups) == 2 and len(set(groups)) == 2, groups
    assert any("InferwatchHostBound" in g for g in groups)
    assert any("InferwatchTimeToFirstTokenHigh" in g for g in groups)
    assert all(c["state"] == "done" and c["steps_captured"] == 3 for c in taken), taken
