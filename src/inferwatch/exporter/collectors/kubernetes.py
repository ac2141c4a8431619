"""Kubernetes attribution as series: the containers that hold each GPU, and the pod of each tracked process.

``gpu_kubernetes_pod_info`` comes from the kubelet's PodResources answer (:mod:`..kubernetes.podresources`,
listed on a thread of its own; here only its latest answer is read). Each GPU's collection keeps the
devices of the answer that name this GPU or one of its MIG devices (whose UUIDs it reads from NVML only
when the answer has MIG device IDs): one series per device and container, joined to other series on
``uuid``, never copied onto them.

``inferwatch_process_kubernetes_info`` is for the processes the exporter already follows (the serving
processes with series, then the GPU processes; at most ``--processes.max``): the pod UID and container ID
from the process's cgroup. PodResources names pods and containers but carries no UID, so a process's pod
is named only through the GPUs it runs on (:func:`name_containers`); the others keep the UID alone, which
kube-state-metrics' ``kube_pod_info{uid}`` names.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..kubernetes.cgroup import ContainerRef, read_container
from ..kubernetes.devices import MigDevice
from ..kubernetes.podresources import PodResourcesWatcher
from ..nvml import GpuContext, text
from ..options import Option, bounded_duration
from ..proc import process_name
from ..samples import FamilySpec, gpu_gauge
from .base import HostContext
from .registry import Registration, register

if TYPE_CHECKING:
    from .processes import ServingProcesses

POD_INFO = gpu_gauge(
    "gpu_kubernetes_pod_info",
    "A container holding this GPU (mig_uuid empty) or one of its MIG devices, from the kubelet's "
    "PodResources API; always 1.",
    "mig_uuid",
    "resource",
    "namespace",
    "pod",
    "container",
)
PROCESS_INFO = FamilySpec(
    "inferwatch_process_kubernetes_info",
    "gauge",
    "The pod UID and container ID of a process from its cgroup; namespace, pod and container where the "
    "GPUs it runs on name them. Always 1.",
    ("pid", "comm", "pod_uid", "container_id", "namespace", "pod", "container"),
)

Holder = tuple[str, str, str]  # namespace, pod, container

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: The extended resources of NVIDIA's device plugin: whole GPUs, their time-sliced replicas when renamed
#: (``renameByDefault``), and MIG devices (``nvidia.com/mig-1g.10gb``, shared or not).
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")


@dataclass(frozen=True)
class KubernetesSettings:
    """The Kubernetes collector's options, parsed (their defaults are the options')."""

    socket: str  # --kubernetes.pod-resources-socket
    resources: tuple[str, ...]  # --kubernetes.resources
    timeout: float  # --kubernetes.timeout, seconds
    interval: float  # --kubernetes.interval, seconds


class PodAttribution:
    """What the two Kubernetes collectors share: the kubelet's latest answer, and the containers the last
    collection of each GPU found holding it (GPU UUID -> holders), which name the pods of its processes."""

    def __init__(self, watcher: PodResourcesWatcher) -> None:
        self.watcher = watcher
        self.holders: dict[str, frozenset[Holder]] = {}

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> PodAttribution:
        return cls(
            PodResourcesWatcher(settings.socket, settings.resources, settings.timeout, settings.interval)
        )


class KubernetesPodsCollector:
    name = "kubernetes"

    def __init__(self, pods: PodAttribution) -> None:
        self._pods = pods

    def collect(self, gpu: GpuContext) -> None:
        allocations = self._pods.watcher.allocations
        migs = _mig_devices(gpu) if any(a.device.is_mig for a in allocations) else []
        # A dict as an ordered set: the replicas of a shared GPU that one container holds are one series.
        held: dict[tuple[str, ...], None] = {}
        for allocation in allocations:
            where = allocation.device.on(gpu.index, gpu.device.uuid, migs)
            if where is not None:
                labels = (allocation.resource, allocation.namespace, allocation.pod, allocation.container)
                held[(where, *labels)] = None
        for labels in held:
            gpu.emit(POD_INFO, 1, *labels)
        self._pods.holders[gpu.device.uuid] = frozenset((ns, pod, c) for _, _, ns, pod, c in held)


def _mig_devices(gpu: GpuContext) -> list[MigDevice]:
    """The MIG devices of a GPU in MIG mode (none otherwise), with their UUIDs and GPU instance ids."""
    mode = gpu.read("nvmlDeviceGetMigMode")
    if mode is None or not mode[0]:
        return []
    found = []
    for slot, handle in gpu.mig_devices():
        uuid = gpu.read("nvmlDeviceGetUUID", handle=handle)
        if uuid is not None:
            instance = gpu.read("nvmlDeviceGetGpuInstanceId", handle=handle)
            found.append(MigDevice(text(uuid), slot, instance))
    return found


class KubernetesProcessesCollector:
    name = "kubernetes_processes"

    def __init__(self, pods: PodAttribution, serving: ServingProcesses) -> None:
        self._pods = pods
        self._serving = serving

    def collect(self, host: HostContext) -> None:
        serving = self._serving.select(host).processes
        followed = dict.fromkeys([*serving, *sorted(host.gpu_processes)])
        containers = {}
        for pid in list(followed)[: self._serving.max_processes]:
            ref = read_container(pid)
            if ref is not None:
                containers[pid] = ref
        pods, names = name_containers(containers, host.gpu_processes, self._pods.holders)
        for pid, ref in containers.items():
            namespace, pod = pods.get(ref.pod_uid, ("", ""))
            container = names.get(ref.container_id, "")
            labels = (str(pid), process_name(pid), ref.pod_uid, ref.container_id, namespace, pod, container)
            host.emit(PROCESS_INFO, 1, *labels)


def name_containers(
    containers: Mapping[int, ContainerRef],
    gpus: Mapping[int, Collection[str]],
    holders: Mapping[str, Collection[Holder]],
) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(namespace, pod) by pod UID and container name by container ID, where the GPUs tell them.

    ``containers``: PID -> its container; ``gpus``: PID -> UUIDs of the GPUs it runs on; ``holders``: GPU
    UUID -> the containers PodResources says hold it. A process whose GPUs are held by one pod names its
    pod UID (every process of that UID then has the name); by one container, its container ID too. Where
    the answers disagree, nothing is named: a UID or container ID named two ways, a pod claimed by two UIDs
    (a pod using a GPU it did not request, such as one run with ``NVIDIA_VISIBLE_DEVICES=all``, shares a
    GPU with the pod that did).
    """
    pod_votes: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)
    container_votes: defaultdict[str, set[Holder]] = defaultdict(set)
    for pid, ref in containers.items():
        held: set[Holder] = set().union(*(holders.get(uuid, ()) for uuid in gpus.get(pid, ())))
        held_pods = {(namespace, pod) for namespace, pod, _ in held}
        if len(held_pods) == 1:
            pod_votes[ref.pod_uid] |= held_pods
        if len(held) == 1:
            container_votes[ref.container_id] |= held
    pods = {uid: next(iter(votes)) for uid, votes in pod_votes.items() if len(votes) == 1}
    claims = Counter(pods.values())
    pods = {uid: pod for uid, pod in pods.items() if claims[pod] == 1}
    uid_of = {ref.container_id: ref.pod_uid for ref in containers.values()}
    names = {}
    for container_id, votes in container_votes.items():
        (namespace, pod, container), *others = votes
        if not others and pods.get(uid_of[container_id]) == (namespace, pod):
            names[container_id] = container
    return pods, names


def parse_resources(value: str) -> tuple[str, ...]:
    """A comma-separated list of extended resource names, ``*`` and ``?`` matching any characters."""
    tokens = tuple(token.strip() for token in value.split(",") if token.strip())
    bad = [t for t in tokens if not re.fullmatch(r"[a-z0-9*?]([-a-z0-9.*?]*/)?[-a-zA-Z0-9._*?]+", t)]
    if bad or not tokens:
        raise ValueError(f"{value!r} is not a list of resource names such as nvidia.com/gpu,nvidia.com/mig-*")
    return tokens


register(
    Registration(
        "kubernetes",
        "pods and containers holding each GPU (the kubelet's PodResources API) and the pod of each process",
        gpu=lambda config, settings, shared: [KubernetesPodsCollector(shared.pods)] if shared.pods else [],
        host=lambda config, settings, shared: (
            [KubernetesProcessesCollector(shared.pods, shared.serving)]
            if shared.pods and shared.serving
            else []
        ),
        settings=KubernetesSettings,
        options=(
            Option(
                "--kubernetes.pod-resources-socket",
                "socket",
                str,
                DEFAULT_SOCKET,
                "the kubelet's PodResources socket; none there means no pod series",
                metavar="PATH",
            ),
            Option(
                "--kubernetes.resources",
                "resources",
                parse_resources,
                ",".join(DEFAULT_RESOURCES),
                "extended resources that are GPUs, comma-separated; * matches any characters",
                metavar="LIST",
            ),
            Option(
                "--kubernetes.timeout",
                "timeout",
                bounded_duration("100ms", "1m"),
                "2s",
                "how long one List of the PodResources API may take (100ms to 1m)",
                metavar="DURATION",
            ),
            Option(
                "--kubernetes.interval",
                "interval",
                bounded_duration("1s", "1h"),
                "10s",
                "how often to List the PodResources API (1s to 1h)",
                metavar="DURATION",
            ),
        ),
    )
)
