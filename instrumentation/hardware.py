"""Hardware peaks the utilization ratios divide by, and the model facts they need.

Peak dense 16-bit tensor FLOP/s come from the vendors' data sheets (no sparsity). Peak memory bandwidth is
read through NVML by the NVML poller (bus width x max memory clock x 2 transfers per clock) and published
in :data:`PEAK_MEMORY_BANDWIDTH`; both can be set in InstrumentConfig instead.
"""

from __future__ import annotations

import threading

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

#: device label (``cuda:0``) -> peak memory bandwidth in bytes/s, as NVML reported it.
PEAK_MEMORY_BANDWIDTH: dict[str, float] = {}
PEAK_MEMORY_BANDWIDTH_LOCK = threading.Lock()


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


def parameter_footprint(model: torch.nn.Module) -> tuple[int, int]:
    """(parameter count, parameter bytes); shared (tied) parameters are counted once."""
    count = size = 0
    for parameter in model.parameters():
        count += parameter.numel()
        size += parameter.numel() * parameter.element_size()
    return count, size
