"""The exporter's whole exposition on the NVML stand-in, byte for byte against a committed golden file.

One fixed scenario (three GPUs: NVLink on one, MIG on another, processes, a call the GPU does not
support, one that fails, GPM on two of them and the blocking PCIe reading on the third) is collected
twice, a GPM window apart, and the text a scrape returns is compared with ``golden/exposition.txt``.
Refactors of the collectors must leave it unchanged: it is the proof that an exposition stays
byte-identical.

The poller and the stand-in run on the test's manual clock, so durations (0), timestamps, utilization
samples, energy and throttle time since the driver loaded are the same at every run. Only what depends
on the real clock or on this process is masked, by :func:`normalise`: the exporter's own ``process_*``
metrics (left out), and the time the web config was loaded (written ``<masked>``; the line, its labels
and its place stay).

``INFERWATCH_UPDATE_GOLDEN=1`` rewrites the golden file from this run instead of comparing (review the
diff before committing it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from inferwatch.exporter.collectors import REGISTRY
from tests.support.clock import ManualClock
from tests.unit.exporter.conftest import MakePoller, render

GOLDEN = Path(__file__).parent / "golden" / "exposition.txt"
UPDATE_ENV = "INFERWATCH_UPDATE_GOLDEN"
MASK = "<masked>"

# PIDs above Linux's largest pid_max (2**22): no process has them, so their comm is "unknown" anywhere.
_BUSY_PID, _IDLE_PID = 2**22 + 1, 2**22 + 2
SCENARIO: dict[str, Any] = {
    "gpus": 3,
    "nvlink": [0],
    "mig": [1],
    "hw_slowdown": [1],
    "no_gpm": [2],
    "processes": {0: [[_BUSY_PID, 3 << 30, 80, 30], [_IDLE_PID, 1 << 30]], 1: [[_IDLE_PID, 2 << 30]]},
    "not_supported": {"nvmlDeviceGetPcieReplayCounter": [2]},
    "failing": {"nvmlDeviceGetEnforcedPowerLimit": [1]},
    "driver_loaded_at": ManualClock().time() - 3600,  # an hour of energy and throttle time counted
}
GPM_WINDOW = 0.15  # seconds: above NVML's 100 ms minimum

# Metrics whose values depend on the wall clock or on this process, and why. Durations, timestamps and
# the stand-in's time-derived readings follow the test's manual clock, and are compared as they are.
_MASKED_VALUES = {
    "inferwatch_exporter_web_config_last_reload_success_timestamp_seconds": "a Unix time, of the real clock",
}
_SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)$")


def normalise(text: str) -> str:
    """The exposition with the exporter's ``process_*`` families dropped and the values of
    :data:`_MASKED_VALUES` replaced by ``<masked>``."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ", 3)
        family = fields[2] if line.startswith("#") and len(fields) > 2 else ""
        match = _SAMPLE_LINE.match(line)
        name = match["name"] if match else family
        if name.startswith("process_"):
            continue
        if match and name in _MASKED_VALUES:
            line = f"{name}{match['labels'] or ''} {MASK}"
        out.append(line)
    return "\n".join(out) + "\n"


def collect_the_scenario(make_poller: MakePoller, fake: Any, clock: ManualClock) -> str:
    """The normalised exposition of two collections of :data:`SCENARIO`, a GPM window apart."""
    fake.reset(**SCENARIO)
    poller = make_poller(
        gpm={"window": GPM_WINDOW},
        pcie_throughput=True,
        host=False,
        kubernetes=False,
        processes={"max_processes": 4},
    )
    poller.collect()  # opens the GPM windows
    clock.advance(GPM_WINDOW + 0.05)
    poller.collect()  # closes them
    return normalise(render(poller))


def test_the_exposition_on_the_stand_in_matches_the_golden_file(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    got = collect_the_scenario(make_poller, fake, clock)

    if os.environ.get(UPDATE_ENV):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got, encoding="utf-8")
    assert got == GOLDEN.read_text(encoding="utf-8")


def test_the_order_collectors_run_in_changes_only_the_order_of_the_series(
    make_poller: MakePoller, fake: Any, clock: ManualClock
) -> None:
    registered = dict(REGISTRY)
    REGISTRY.clear()
    REGISTRY.update(reversed(registered.items()))  # pcie_throughput before gpm, kubernetes first...
    try:
        got = collect_the_scenario(make_poller, fake, clock)
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)
    golden = GOLDEN.read_text(encoding="utf-8")
    assert got != golden
    assert sorted(got.splitlines()) == sorted(golden.splitlines())
