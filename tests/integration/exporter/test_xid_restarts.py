"""Every XID counted and paged across exporter restarts, a driver reset and a code's first occurrence:
a real Prometheus scraping the exporter (over the NVML stand-in) every second, with alerts/rules.yaml.

Three lives of the exporter share a state directory (``--state.dir``). XID 48 on GPU 1 in the first life,
again in the second (inside the rule's 10m window, on the same GPU), again after a driver reset, and again
in the third, delivered before its first scrape; XID 79 twice on GPU 0 in the first life; a new code, 94,
in the second. Before, the counter of XID 48 came back at 1 after each restart: ``increase()`` counted 0
of them and the alert stayed silent for the repeat.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import PACKAGE_ROOT, REPO_ROOT, free_port
from tests.support.services import start_exporter, start_prometheus, wait_until

pytestmark = pytest.mark.integration

FAKE_NVML = "tests.support.fake_nvml"
FAST = ["--collector.interval=200ms", "--collector.timeout=2s", "--nvml.retry-interval=200ms"]
JOB = "inferwatch-exporter"
RULES = PACKAGE_ROOT / "alerts" / "rules.yaml"
ALERT = "InferwatchGpuXidError"


def _rises(values: list[float]) -> float:
    """What ``increase()`` counts before extrapolation: every rise, a drop taken as a reset from zero."""
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(values))


def test_every_xid_is_counted_and_paged_across_restarts_a_driver_reset_and_a_first_occurrence(
    tmp_path: Path,
) -> None:
    port = free_port()
    state = tmp_path / "state"
    injected: dict[tuple[str, str], int] = {}
    lives = itertools.count()

    @contextmanager
    def life(*first_xids: tuple[int, int]) -> Iterator[Any]:
        """One life of the exporter, with a control file of its own (a new process reads its file from
        the start); ``first_xids`` are queued before it starts, so they arrive before its first scrape."""
        control = tmp_path / f"control-{next(lives)}.jsonl"

        def fault(op: str, **args: Any) -> None:
            with control.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"op": op, **args}) + "\n")

        for gpu, xid in first_xids:
            fault("xid", gpu=gpu, xid=xid)
            injected[(str(gpu), str(xid))] = injected.get((str(gpu), str(xid)), 0) + 1
        env = {
            "INFERWATCH_EXPORTER_NVML_MODULE": FAKE_NVML,
            "FAKE_NVML_SCENARIO": json.dumps({"gpus": 2}),
            "FAKE_NVML_CONTROL": str(control),
            "PYTHONPATH": str(REPO_ROOT),
        }
        args = [*FAST, f"--state.dir={state}"]
        with start_exporter(port, extra_args=args, env=env, workdir=tmp_path / control.stem):
            yield fault

    def xid(fault: Any, gpu: int, code: int) -> None:
        fault("xid", gpu=gpu, xid=code)
        injected[(str(gpu), str(code))] = injected.get((str(gpu), str(code)), 0) + 1
        paged(gpu, code, time.time())

    def paged(gpu: int, code: int, at: float) -> None:
        """The alert is active for this GPU and code, and its value says the XID just injected."""

        def active() -> bool:
            for alert in prom.api("alerts")["alerts"]:
                labels = alert["labels"]
                if (labels["alertname"], labels.get("gpu"), labels.get("xid")) == (
                    ALERT,
                    str(gpu),
                    str(code),
                ):
                    return float(alert["value"]) <= time.time() - at + 1
            return False

        wait_until(active, 20, f"{ALERT} for XID {code} on GPU {gpu} injected at {at:.0f}")

    with start_prometheus({JOB: [f"127.0.0.1:{port}"]}, [RULES], workdir=tmp_path / "prometheus") as prom:
        started = time.time()
        with life() as fault:
            prom.wait_for_series('gpu_xid_errors_total{gpu="1", xid="48"} == 0')  # born at zero
            xid(fault, 1, 48)
            xid(fault, 0, 79)
            time.sleep(2)
            xid(fault, 0, 79)
            time.sleep(2)
        with life() as fault:
            prom.wait_for_series('gpu_xid_errors_total{gpu="1", xid="48"} == 1')  # carried over
            time.sleep(2)
            xid(fault, 1, 48)  # the same code on the same GPU, 10m window still holding the first
            xid(fault, 0, 94)  # a new code
            time.sleep(2)
            fault("driver_reset", at=time.time())
            time.sleep(2)
            xid(fault, 1, 48)  # after the driver reset
            time.sleep(2)
        before_third = time.time()
        with life((1, 48)):  # delivered before the first scrape of this life
            paged(1, 48, before_third)
            prom.wait_for_series(f'gpu_xid_errors_total{{gpu="1", xid="48"}} == {injected[("1", "48")]}')
            time.sleep(3)
            window = int(time.time() - started) + 5
            for (gpu, code), count in injected.items():
                selector = f'gpu_xid_errors_total{{gpu="{gpu}", xid="{code}"}}'
                [series] = prom.query(f"{selector}[{window}s]")
                assert _rises([float(v) for _, v in series["values"]]) == count, (gpu, code)
                [increase] = prom.query(f"increase({selector}[{window}s])")
                assert round(float(increase["value"][1])) == count, (gpu, code, increase)
            # Each reaches firing after the rule's `for: 1m`.
            expected = {(gpu, code) for gpu, code in injected}

            def firing() -> set[tuple[str, str]]:
                return {
                    (a["labels"]["gpu"], a["labels"]["xid"])
                    for a in prom.api("alerts")["alerts"]
                    if a["labels"].get("alertname") == ALERT and a["state"] == "firing"
                }

            wait_until(lambda: firing() == expected, 90, lambda: f"{expected} firing (now {firing()})")
    assert sum(injected.values()) == 7
