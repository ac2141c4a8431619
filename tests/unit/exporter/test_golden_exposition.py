"""The exporter's whole exposition on the NVML stand-in, byte for byte against a committed golden file.

One fixed scenario (three GPUs: NVLink on one, MIG on another, processes, a call the GPU does not
support, one that fails, GPM on two of them and the blocking PCIe reading on the third) is collected
twice, a GPM window apart, and the text a scrape returns is compared with ``golden/exposition.txt``.
Refactors of the collectors must leave it unchanged: it is the proof that an exposition stays
byte-identical.

Only what depends on wall time or on this process is masked, by :func:`normalise`: the exporter's own
``process_*`` metrics, durations and timestamps, and the stand-in's readings that it derives from the
wall clock (utilization samples, energy and throttle time since the driver loaded). Each masked value
is written ``<masked>``; the line, its labels and its place stay.

``INFERWATCH_UPDATE_GOLDEN=1`` rewrites the golden file from this run instead of comparing (review the
diff before committing it).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

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
}
GPM_WINDOW = 0.15  # seconds: above NVML's 100 ms minimum

# Metrics whose values depend on the wall clock or on this process, and why.
_MASKED_VALUES = {
    "inferwatch_exporter_collect_duration_seconds": "wall time of a collection",
    "inferwatch_exporter_collector_duration_seconds": "wall time of a collector",
    "inferwatch_exporter_gpu_collect_duration_seconds": "wall time of a GPU's collection",
    "inferwatch_exporter_last_collect_timestamp_seconds": "a Unix time",
    "inferwatch_exporter_gpu_last_collect_timestamp_seconds": "a Unix time",
    "inferwatch_exporter_web_config_last_reload_success_timestamp_seconds": "a Unix time",
    "gpu_utilization_ratio": "the stand-in's samples alternate with the wall clock",
    "gpu_memory_bandwidth_utilization_ratio": "the stand-in's samples alternate with the wall clock",
    "gpu_energy_joules_total": "the stand-in's energy grows with the wall clock",
    "gpu_clocks_event_seconds_total": "the stand-in's throttle time grows with the wall clock",
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


def test_the_exposition_on_the_stand_in_matches_the_golden_file(make_poller: MakePoller, fake: Any) -> None:
    fake.reset(**SCENARIO)
    poller = make_poller(
        gpm_window=GPM_WINDOW, pcie_throughput=True, host=False, kubernetes=False, processes_max=4
    )
    poller.collect()  # opens the GPM windows
    time.sleep(GPM_WINDOW + 0.05)
    poller.collect()  # closes them
    got = normalise(render(poller))

    if os.environ.get(UPDATE_ENV):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got, encoding="utf-8")
    assert got == GOLDEN.read_text(encoding="utf-8")
