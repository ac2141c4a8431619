"""Hardware peaks the utilization ratios divide by, and the model facts they need.

Peak dense 16-bit tensor FLOP/s come from the vendors' data sheets (no sparsity). Peak memory bandwidth is
read through NVML by the NVML poller (bus width x max memory clock x 2 transfers per clock), which the
model's poller is handed; both can be set in InstrumentConfig instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

# (substring of the CUDA device name, dense bf16/fp16 tensor FLOP/s), most specific first.
PEAK_DENSE_16BIT_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def table_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """Dense tensor-core FLOP/s of a known GPU for 16-bit dtypes; None when unknown."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for fragment, flops in PEAK_DENSE_16BIT_FLOPS:
        if fragment in device_name:
            return flops
    return None


def device_label(device: torch.device) -> str:
    """The ``device`` label value: ``cuda:0``, ``cpu``."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


@dataclass(frozen=True)
class DeviceIdentity:
    """The labels that name a model's device on every per-device ``llm_*`` series.

    ``device`` is torch's name in this process (``cuda:0``), which CUDA_VISIBLE_DEVICES and containers
    renumber; ``uuid`` is the physical GPU's UUID as NVML spells it (``GPU-...``), the label the exporter's
    ``gpu_*`` series carry, so the two sides join on it; ``mig_uuid`` is the MIG device's (``MIG-...``)
    when the model runs on a MIG instance. Both are empty on the CPU, and ``uuid`` is empty on a MIG
    instance whose parent GPU cannot be found (no /proc/driver/nvidia).
    """

    device: str
    uuid: str = ""
    mig_uuid: str = ""

    @property
    def labels(self) -> tuple[str, str, str]:
        return self.device, self.uuid, self.mig_uuid


#: Where the NVIDIA driver describes each GPU it drives, one folder per PCI address (also inside
#: containers, for the GPUs they were given).
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def device_identity(device: torch.device, proc: Path = NVIDIA_PROC) -> DeviceIdentity:
    """The identity of ``device`` from torch's device properties and the driver's /proc files: no NVML
    call, so it can run in the serving thread at ``instrument()`` without risk of a hung driver call."""
    label = device_label(device)
    if device.type != "cuda":
        return DeviceIdentity(label)
    p = torch.cuda.get_device_properties(device)
    address = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return gpu_identity(label, str(p.uuid), driver_gpu_uuid(proc / address), visible)


def gpu_identity(label: str, cuda_uuid: str, parent_uuid: str | None, visible_devices: str) -> DeviceIdentity:
    """The identity of a CUDA device whose UUID CUDA reports as ``cuda_uuid`` (no prefix), on the PCI
    device whose GPU UUID the driver reports as ``parent_uuid`` (None: not known).

    CUDA reports a MIG instance's own UUID, on its parent GPU's PCI address: a UUID that differs from the
    GPU's at that address is a MIG instance. Without the driver's view, a MIG instance is told by
    CUDA_VISIBLE_DEVICES naming MIG devices (the only way CUDA is given one).
    """
    bare = cuda_uuid.removeprefix("GPU-").removeprefix("MIG-")
    if not bare:
        return DeviceIdentity(label)
    if parent_uuid is not None:
        if parent_uuid == f"GPU-{bare}":
            return DeviceIdentity(label, parent_uuid)
        return DeviceIdentity(label, parent_uuid, f"MIG-{bare}")
    if any(entry.strip().startswith("MIG-") for entry in visible_devices.split(",")):
        return DeviceIdentity(label, "", f"MIG-{bare}")
    return DeviceIdentity(label, f"GPU-{bare}")


def driver_gpu_uuid(folder: Path) -> str | None:
    """The ``GPU UUID`` line of the driver's ``information`` file in ``folder``; None when unreadable."""
    try:
        text = (folder / "information").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "GPU UUID" and value.strip():
            return value.strip()
    return None


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's (first) parameters live; the device its forward's work is timed on."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.get_default_dtype()


@dataclass(frozen=True)
class Footprint:
    """What the utilization ratios need to know about a model's weights (tied weights counted once)."""

    #: All parameters (the ``params`` label of llm_model_info).
    count: int
    #: Parameters a prompt token is multiplied with: all but the input embedding table (a lookup) and
    #: the output projection (generate computes logits for the last position only).
    matmul_count: int
    #: Bytes a decode step reads: every weight except the input embedding table, of which it reads only
    #: the rows of its tokens (unless the table is shared with the output projection).
    decode_read_bytes: int

    def decode_bytes(self, kv_bytes: float) -> float:
        """Bytes a decode step reads: the weights and the whole KV cache of ``kv_bytes``."""
        return self.decode_read_bytes + kv_bytes

    def prefill_flops(self, tokens: int) -> float:
        """FLOPs a prefill of ``tokens`` prompt tokens (all sequences) computes."""
        return 2.0 * self.matmul_count * tokens


def parameter_footprint(model: torch.nn.Module) -> Footprint:
    count = size = 0
    for parameter in model.parameters():
        count += parameter.numel()
        size += parameter.numel() * parameter.element_size()
    embeddings = _weight(model, "get_input_embeddings")
    projection = _weight(model, "get_output_embeddings")
    matmul_count, read_bytes = count, size
    for weight in {id(w): w for w in (embeddings, projection) if w is not None}.values():
        matmul_count -= weight.numel()
    if embeddings is not None and embeddings is not projection:
        read_bytes -= embeddings.numel() * embeddings.element_size()
    return Footprint(count, matmul_count, read_bytes)


def _weight(model: torch.nn.Module, getter: str) -> torch.Tensor | None:
    try:
        module = getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None
