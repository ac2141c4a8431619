"""The Kubernetes pod and container a process runs in, from its cgroup (``/proc/<pid>/cgroup``).

The kubelet puts every pod in a cgroup named after its UID, and the container runtime puts each container
in a cgroup named after its ID, under the pod's. The names depend on the kubelet's cgroup driver and on
the runtime, in cgroup v1 (a line per hierarchy) and v2 (one ``0::`` line) alike:

* systemd driver: ``.../kubepods-burstable-pod<uid with _ for ->.slice/<runtime>-<id>.scope``, the
  runtime prefix ``cri-containerd``, ``crio`` or ``docker`` (Guaranteed pods: ``kubepods-pod<uid>.slice``);
* cgroupfs driver: ``.../kubepods/burstable/pod<uid>/<id>`` (CRI-O: ``crio-<id>``).

The pattern is searched anywhere in the path, not anchored: seen from a container with a cgroup namespace
of its own (the default under cgroup v2), another container's path is relative to the reader's, such as
``/../../kubepods-besteffort.slice/...``, and a process may sit in a cgroup of its own below its
container's. A static pod's UID is the hash of its manifest (32 hex digits, no dashes). Processes outside
any container (the host's, CRI-O's ``conmon``, the pod's own cgroup) have no container: None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Where the processes are; the tests point it at a directory of their own.
PROC = "/proc"

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_CONTAINER = r"[0-9a-f]{64}"
_PATTERNS = (
    re.compile(
        rf"kubepods(?:-[a-z]+)?-pod(?P<uid>{_UID})\.slice/"
        rf"(?:cri-containerd|crio|docker)-(?P<id>{_CONTAINER})\.scope"
    ),
    re.compile(rf"/pod(?P<uid>{_UID})/(?:crio-)?(?P<id>{_CONTAINER})(?:/|$)"),
)


@dataclass(frozen=True)
class ContainerRef:
    """A container as the node knows it: the pod's UID (with dashes) and the runtime's container ID."""

    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> ContainerRef | None:
    """The container whose cgroup the ``/proc/<pid>/cgroup`` ``text`` names, or None outside containers."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for pattern in _PATTERNS:
            match = pattern.search(path)
            if match:
                return ContainerRef(match["uid"].replace("_", "-"), match["id"])
    return None


def read_container(pid: int) -> ContainerRef | None:
    """The container of process ``pid``, or None outside containers or when it exited or is not visible."""
    try:
        with open(f"{PROC}/{pid}/cgroup", encoding="utf-8", errors="replace") as cgroup:
            return parse_cgroup(cgroup.read())
    except OSError:
        return None
