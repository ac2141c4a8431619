"""Which GPU, or which MIG device of it, a device ID in the kubelet's PodResources answer names.

Device plugins choose their device IDs. The forms known, and where they come from:

=============================  ======================================================================
``GPU-<uuid>``                 NVIDIA device plugin, whole GPU (its default ``DEVICE_ID_STRATEGY=uuid``)
``<index>``                    NVIDIA device plugin with ``DEVICE_ID_STRATEGY=index`` (the NVML index)
``<index>:<slot>``             the same for a MIG device: its parent's index and its NVML MIG slot
``nvidia<index>``              GKE's device plugin
``MIG-<uuid>``                 a MIG device (drivers from R470 on)
``MIG-GPU-<uuid>/<gi>/<ci>``   a MIG device, drivers before R470: the parent's UUID, GPU instance id
``nvidia<index>/gi<gi>``       GKE's MIG devices: the parent's index, GPU instance id
=============================  ======================================================================

A shared GPU (time-slicing, MPS) is one device ID per replica: the NVIDIA device plugin appends
``::<replica>``, GKE ``/vgpu<replica>``. The suffix is dropped: every replica names the same GPU, so a
container holding two replicas holds the GPU once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_REPLICA = re.compile(r"(?:::\d+|/vgpu\d+)$")
_GPU_UUID = r"GPU-[0-9a-fA-F-]+"
_FORMS = (
    re.compile(rf"(?P<gpu_uuid>{_GPU_UUID})"),
    re.compile(r"(?:nvidia)?(?P<gpu_index>\d+)"),
    re.compile(r"(?P<gpu_index>\d+):(?P<mig_slot>\d+)"),
    re.compile(r"(?P<mig_uuid>MIG-[0-9a-fA-F-]+)"),
    re.compile(rf"MIG-(?P<gpu_uuid>{_GPU_UUID})/(?P<gpu_instance>\d+)/\d+"),
    re.compile(r"nvidia(?P<gpu_index>\d+)/gi(?P<gpu_instance>\d+)"),
)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device of a GPU: its UUID, NVML slot and GPU instance id (None where NVML did not say)."""

    uuid: str
    slot: int
    gpu_instance: int | None


@dataclass(frozen=True)
class DeviceRef:
    """What a device ID names: a GPU (by UUID or index), and for a MIG device which one of it (by MIG
    UUID alone, or by slot or GPU instance id within the GPU)."""

    gpu_uuid: str = ""
    gpu_index: int | None = None
    mig_uuid: str = ""
    mig_slot: int | None = None
    gpu_instance: int | None = None

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_uuid) or self.mig_slot is not None or self.gpu_instance is not None

    def on(self, index: int, uuid: str, migs: Iterable[MigDevice]) -> str | None:
        """Where this device is on GPU (``index``, ``uuid``) with MIG devices ``migs``: ``""`` for the
        whole GPU, a MIG device's UUID, or None when it is not on this GPU (or its MIG device is not
        among ``migs``)."""
        if self.mig_uuid:
            return self.mig_uuid if any(m.uuid == self.mig_uuid for m in migs) else None
        if uuid != self.gpu_uuid and index != self.gpu_index:
            return None
        if not self.is_mig:
            return ""
        for mig in migs:
            if mig.slot == self.mig_slot or (
                self.gpu_instance is not None and mig.gpu_instance == self.gpu_instance
            ):
                return mig.uuid
        return None


def parse_device_id(device_id: str) -> DeviceRef | None:
    """The device ``device_id`` names, or None for a form not known (see the module's table)."""
    bare = _REPLICA.sub("", device_id)
    for form in _FORMS:
        match = form.fullmatch(bare)
        if match:
            fields = match.groupdict()
            return DeviceRef(
                gpu_uuid=fields.get("gpu_uuid") or "",
                gpu_index=_number(fields.get("gpu_index")),
                mig_uuid=fields.get("mig_uuid") or "",
                mig_slot=_number(fields.get("mig_slot")),
                gpu_instance=_number(fields.get("gpu_instance")),
            )
    return None


def _number(digits: str | None) -> int | None:
    return None if digits is None else int(digits)
