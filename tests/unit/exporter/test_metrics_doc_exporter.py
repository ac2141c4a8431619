"""docs/metrics.md's Exporter section and what the exporter exposes, kept in step both ways.

The exposition comes from a collection over the NVML stand-in set up so that every collector has
something to say: several GPUs, one with NVLink and one in MIG mode, a process on a GPU (in a pod's
container, by its cgroup), PCIe throughput on, a GPM window closed, an XID event delivered, and the
stand-in kubelet listing a pod on a GPU.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from inferwatch.exporter.kubernetes import cgroup
from tests.support import documented_metrics, exposed_metrics, fake_nvml
from tests.support.clock import ManualClock
from tests.support.kubelet import PodResourcesServer, gpu_pod
from tests.unit.exporter.conftest import MakePoller, own_process, render

CONTAINER_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod0f1e2d3c_4b5a_4697_8877_665544332211.slice/cri-containerd-" + "c" * 64 + ".scope\n"
)


def test_every_exposed_metric_is_documented_and_every_documented_one_exposed(
    make_poller: MakePoller, fake: Any, clock: ManualClock, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.reset(gpus=3, nvlink=[0], mig=[1], processes={0: own_process()})
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(os.getpid()))
    (tmp_path / "proc" / str(os.getpid())).mkdir(parents=True)
    (tmp_path / "proc" / str(os.getpid()) / "cgroup").write_text(CONTAINER_CGROUP)
    monkeypatch.setattr(cgroup, "PROC", str(tmp_path / "proc"))
    kubelet = PodResourcesServer(tmp_path / "kubelet.sock", [gpu_pod("ns", "llm-0", fake_nvml.gpu_uuid(0))])
    poller = make_poller(
        xid=True,
        pcie_throughput=True,
        processes={"pid_files": (str(pid_file),)},
        gpm={"window": 0.15},
        kubernetes={"socket": kubelet.socket_path},
    )
    with kubelet:
        poller.pods.watcher.refresh()
    poller.collect()  # opens the GPM window ...
    clock.advance(0.2)
    poller.collect()  # ... and closes it
    # An XID event as the XID thread records it (the thread itself is tested in
    # tests/integration/exporter/test_poller_timing.py).
    poller.xid_events.record(("2", fake_nvml.gpu_uuid(2)), 48, clock.time())

    exposed = exposed_metrics(render(poller))
    documented = documented_metrics("Exporter")
    assert sorted(set(exposed) - set(documented)) == [], "exposed but not in docs/metrics.md"
    assert sorted(set(documented) - set(exposed)) == [], "in docs/metrics.md but not exposed"
    assert {name: exposed[name] for name in documented} == documented, "types differ"
