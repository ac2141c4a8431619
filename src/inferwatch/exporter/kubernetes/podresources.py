"""The kubelet's PodResources API: which containers hold which GPU devices, asked on a thread of its own.

A :class:`PodResourcesWatcher` calls ``List`` (v1, gRPC over the node's unix socket) every
``--kubernetes.interval`` with a deadline of ``--kubernetes.timeout``, and keeps the GPU devices of the
answer (those of the ``--kubernetes.resources`` resources) in :attr:`~PodResourcesWatcher.allocations`,
which the collectors read: a kubelet that hangs holds up this thread only, never a scrape or the NVML
collection. When ``List`` fails (no socket, timed out, unreachable, an answer that does not decode or
holds what no kubelet sends) the allocations are emptied, so there are no pod series rather than stale
ones; the failure is counted by kind, and logged once per kind until a ``List`` answers again.

gRPC is imported at the first ``List``, once the socket exists: an exporter off Kubernetes (or on a node
whose socket is not mounted) never loads it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from inferwatch.common.lograte import RateLimit

from ..samples import FamilySpec, Sample
from ..selfmetrics import Tally
from .devices import DeviceRef, parse_device_id

log = logging.getLogger(__name__)
log.addFilter(RateLimit())

#: The service of podresources.proto and the path gRPC gives its List method.
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"

# Why a List failed: the ``error`` label values, all exported from the start.
SOCKET_ABSENT = "socket_absent"  # no socket at the path: not a Kubernetes node, or not mounted
NO_GRPC = "no_grpc"  # grpcio or protobuf missing, or protobuf older than the generated code needs
TIMEOUT = "timeout"  # no answer within --kubernetes.timeout
UNAVAILABLE = "unavailable"  # the socket refuses (kubelet restarting, no permission, not gRPC)
MALFORMED = "malformed"  # an answer that does not decode, or with names no kubelet sends
OTHER = "other"  # any other gRPC status, or a bug here
ERRORS = (SOCKET_ABSENT, NO_GRPC, TIMEOUT, UNAVAILABLE, MALFORMED, OTHER)

UP = FamilySpec(
    "inferwatch_exporter_kubernetes_up",
    "gauge",
    "1 when the last List of the kubelet's PodResources API answered and the answer was used, else 0.",
)
ERRORS_TOTAL = FamilySpec(
    "inferwatch_exporter_kubernetes_errors_total",
    "counter",
    "Failed Lists of the kubelet's PodResources API, by error; there are no pod series meanwhile.",
    ("error",),
)
LIST_DURATION = FamilySpec(
    "inferwatch_exporter_kubernetes_list_duration_seconds",
    "gauge",
    "Wall time of the last List of the kubelet's PodResources API (a timed-out one: the timeout).",
)

# More GPU devices than any node holds: an answer beyond is not a kubelet's, and would flood the labels.
MAX_ALLOCATIONS = 4096
# Kubernetes' own limits on the names (DNS-1123 labels and subdomains, qualified resource names), and a
# bound on device IDs.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_RESOURCE = re.compile(r"(?=.{1,317}$)([a-z0-9][-a-z0-9.]*/)?[A-Za-z0-9][-A-Za-z0-9_.]*")
_DEVICE_ID = re.compile(r"[\x21-\x7e]{1,256}")


class MalformedAnswer(ValueError):
    """A List answer that decodes but holds what no kubelet sends."""


@dataclass(frozen=True)
class Allocation:
    """One GPU device (or replica of a shared one) held by one container, as the kubelet answered it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: DeviceRef


def gpu_allocations(response: Any, resources: Sequence[str]) -> tuple[Allocation, ...]:
    """The devices of the ``resources`` patterns (``fnmatch``) in a ``ListPodResourcesResponse``.

    Device IDs of a form not known (:mod:`.devices`) are left out. Raises :class:`MalformedAnswer` for a
    name that is not a Kubernetes name (of a namespace, pod, container or resource), a device ID that is
    not printable, or more than :data:`MAX_ALLOCATIONS` devices.
    """
    found = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not any(fnmatchcase(devices.resource_name, pattern) for pattern in resources):
                    continue
                for device_id in devices.device_ids:
                    _check(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
                    device = parse_device_id(device_id)
                    if device is None:
                        log.debug(
                            "%s device ID %r is of a form not known; left out",
                            devices.resource_name,
                            device_id,
                        )
                        continue
                    found.append(
                        Allocation(pod.namespace, pod.name, container.name, devices.resource_name, device)
                    )
                    if len(found) > MAX_ALLOCATIONS:
                        raise MalformedAnswer(f"more than {MAX_ALLOCATIONS} GPU devices")
    return tuple(found)


def _check(namespace: str, pod: str, container: str, resource: str, device_id: str) -> None:
    for what, value, pattern in (
        ("namespace", namespace, _LABEL),
        ("pod name", pod, _SUBDOMAIN),
        ("container name", container, _LABEL),
        ("resource name", resource, _RESOURCE),
        ("device ID", device_id, _DEVICE_ID),
    ):
        if not pattern.fullmatch(value):
            raise MalformedAnswer(f"{what} {value[:80]!r} is not one Kubernetes sends")


class ListFailed(Exception):
    """A List that gave no usable answer; ``error`` is one of :data:`ERRORS`."""

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error


class PodResourcesWatcher:
    """Lists the kubelet's pod resources every ``interval`` on a daemon thread; the latest answer's GPU
    devices are in :attr:`allocations` (empty while Lists fail)."""

    def __init__(self, socket_path: str, resources: Sequence[str], timeout: float, interval: float) -> None:
        self.allocations: tuple[Allocation, ...] = ()
        self.errors = Tally(ERRORS_TOTAL, preset=[(error,) for error in ERRORS])
        self.version = 0  # changes with every List, so that a cached exposition knows it is stale
        self._socket_path = socket_path
        self._resources = tuple(resources)
        self._timeout = timeout
        self._interval = interval
        self._up = False
        self._duration: float | None = None
        self._failing = ""  # the error last logged; "" while Lists answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubernetes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; it does after the List in progress (at most ``timeout``)."""
        self._stop.set()

    def samples(self) -> Iterator[Sample]:
        yield Sample(UP, (), 1.0 if self._up else 0.0)
        if self._duration is not None:
            yield Sample(LIST_DURATION, (), self._duration)
        yield from self.errors.samples()

    def refresh(self) -> None:
        """One List now: :attr:`allocations` from its answer, or emptied and the failure counted."""
        try:
            found = self._list()
        except Exception as exc:  # a ListFailed, or a bug here: either costs this List only
            failure = exc if isinstance(exc, ListFailed) else ListFailed(OTHER, repr(exc))
            self.allocations, self._up = (), False
            self.errors.add(failure.error)
            self._log_failure(failure)
        else:
            self.allocations, self._up = found, True
            if self._failing:
                log.info("kubelet PodResources answers again: %d GPU devices held", len(found))
            self._failing = ""
        finally:
            self.version += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._interval)

    def _list(self) -> tuple[Allocation, ...]:
        if not os.path.exists(self._socket_path):
            raise ListFailed(SOCKET_ABSENT, f"no socket at {self._socket_path}")
        try:
            # Here, not at the top: gRPC and protobuf cost memory an exporter off Kubernetes must not pay.
            import grpc
            from google.protobuf.message import DecodeError

            from . import podresources_pb2 as pb2
        except Exception as exc:  # not installed, or protobuf older than the generated code (VersionError)
            raise ListFailed(NO_GRPC, repr(exc)) from None
        # A channel per List: a kubelet that restarted is reached at once, never after gRPC's reconnect
        # backoff (up to 2 minutes), and nothing stays connected to a kubelet that hangs.
        with grpc.insecure_channel(f"unix:{self._socket_path}") as channel:
            # The answer is decoded here rather than by gRPC, which logs a traceback for each it cannot.
            call = channel.unary_unary(
                LIST_METHOD, request_serializer=pb2.ListPodResourcesRequest.SerializeToString
            )
            started = time.perf_counter()
            try:
                answer = call(pb2.ListPodResourcesRequest(), timeout=self._timeout)
            except grpc.RpcError as exc:
                raise ListFailed(_error_of(exc.code(), grpc.StatusCode), exc.details() or "") from None
            finally:
                self._duration = time.perf_counter() - started
        try:
            return gpu_allocations(pb2.ListPodResourcesResponse.FromString(answer), self._resources)
        except (DecodeError, MalformedAnswer) as exc:
            raise ListFailed(MALFORMED, str(exc)) from None

    def _log_failure(self, exc: ListFailed) -> None:
        if exc.error == self._failing:
            log.debug("kubelet PodResources: %s (%s)", exc.error, exc)
            return
        self._failing = exc.error
        if exc.error == SOCKET_ABSENT:
            log.info("%s: no pod series (not a Kubernetes node, or the socket is not mounted)", exc)
        else:
            log.warning(
                "kubelet PodResources at %s: %s (%s); no pod series", self._socket_path, exc.error, exc
            )


def _error_of(code: Any, codes: Any) -> str:
    """The ``error`` label of a gRPC status code; RESOURCE_EXHAUSTED is an answer larger than gRPC takes
    (4 MiB), which no kubelet's is."""
    if code == codes.DEADLINE_EXCEEDED:
        return TIMEOUT
    if code == codes.UNAVAILABLE:
        return UNAVAILABLE
    if code == codes.RESOURCE_EXHAUSTED:
        return MALFORMED
    return OTHER
