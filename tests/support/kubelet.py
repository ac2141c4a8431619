"""A stand-in for the kubelet's PodResources API: a real gRPC server of the published ``PodResourcesLister``
v1 service (its method, and the messages of the exporter's generated ``podresources_pb2``) on a
unix socket, answering ``List`` with the pods it is given. The kubelet cannot run here; the client, the
protocol and the socket are real.

Pods are data::

    with PodResourcesServer(tmp_path / "kubelet.sock", [gpu_pod("team-a", "llm-0", fake_nvml.gpu_uuid(2))]):
        ...  # an exporter with --kubernetes.pod-resources-socket pointing there sees the pod on GPU 2

``server.pods`` may be replaced while it serves, and ``server.mode`` switched: ``"answer"`` (the pods),
``"hang"`` (never answers: each List waits until the client's deadline passes or the server stops) or
``"garbage"`` (bytes that are no ``ListPodResourcesResponse``). An answer the kubelet would never give
in form, such as a pod name that is not a Kubernetes name, is given as pods. ``server.lists`` counts the
Lists received.

PodResources v1 carries no pod UID: a pod is its namespace, name and containers; the UID that a process's
cgroup holds cannot be given here (docs/exporter.md, "Kubernetes", says how the exporter joins the two).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from inferwatch.exporter.kubernetes import podresources_pb2 as pb2
from inferwatch.exporter.kubernetes.podresources import SERVICE

GPU = "nvidia.com/gpu"
# sun_path of struct sockaddr_un holds 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107
GARBAGE = b"\xff\xff\xff\xff not a protobuf message"
MODES = ("answer", "hang", "garbage")


@dataclass(frozen=True)
class Pod:
    """A pod as PodResources lists it: containers by name, each with its device IDs by resource name."""

    namespace: str
    name: str
    containers: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)

    def message(self) -> Any:
        return pb2.PodResources(
            name=self.name,
            namespace=self.namespace,
            containers=[
                pb2.ContainerResources(
                    name=container,
                    devices=[
                        pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                        for resource, ids in devices.items()
                    ],
                )
                for container, devices in self.containers.items()
            ],
        )


def gpu_pod(namespace: str, name: str, *device_ids: str, container: str = "main", resource: str = GPU) -> Pod:
    """A pod of one container holding ``device_ids`` of ``resource``."""
    return Pod(namespace, name, {container: {resource: device_ids}})


class PodResourcesServer:
    """The stand-in kubelet on ``socket_path``, serving from ``__enter__`` (or :meth:`start`) until
    ``__exit__`` (or :meth:`stop`)."""

    def __init__(self, socket_path: str | Path, pods: Iterable[Pod] = (), mode: str = "answer") -> None:
        self.socket_path = str(socket_path)
        if len(self.socket_path.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{self.socket_path!r} is longer than a unix socket path can be ({MAX_SOCKET_PATH})"
            )
        self.pods = list(pods)
        self.mode = mode
        self.lists = 0
        self._stopped = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet"))
        handler = grpc.unary_unary_rpc_method_handler(
            self._list,
            request_deserializer=pb2.ListPodResourcesRequest.FromString,
            response_serializer=_serialize,
        )
        self._server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(SERVICE, {"List": handler})]
        )
        self._server.add_insecure_port(f"unix:{self.socket_path}")

    def start(self) -> PodResourcesServer:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (a hung List is let go first)."""
        self._stopped.set()
        self._server.stop(grace=None).wait()
        Path(self.socket_path).unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _list(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.lists += 1
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}")
        if self.mode == "hang":
            gone = threading.Event()
            context.add_callback(gone.set)  # the client's deadline passed, or it went away
            while not gone.is_set() and not self._stopped.is_set():
                gone.wait(0.05)
            return pb2.ListPodResourcesResponse()
        if self.mode == "garbage":
            return GARBAGE
        return pb2.ListPodResourcesResponse(pod_resources=[pod.message() for pod in self.pods])


def _serialize(response: Any) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()
