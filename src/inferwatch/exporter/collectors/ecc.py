"""Memory errors: ECC counts and row remapping (the HBM repair mechanism of A100 and later)."""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_counter, gpu_gauge
from .registry import Registration, register

ECC_MODE = gpu_gauge("gpu_ecc_mode", "1 when ECC is enabled.")
ECC_ERRORS = gpu_counter(
    "gpu_ecc_errors_total",
    "ECC errors by type (corrected, uncorrected) and scope (volatile: since driver load; aggregate).",
    "type",
    "scope",
)
REMAPPED_ROWS = gpu_gauge(
    "gpu_remapped_rows", "Memory rows remapped to spares, by the kind of error that caused it.", "cause"
)
REMAPPED_ROWS_PENDING = gpu_gauge(
    "gpu_remapped_rows_pending", "1 when a remapping waits for the next GPU reset to take effect."
)
REMAPPED_ROWS_FAILED = gpu_gauge(
    "gpu_remapped_rows_failed", "1 when a row could not be remapped (no spare left): replace the GPU."
)

# nvmlMemoryErrorType_t x nvmlEccCounterType_t
_ECC_COUNTERS = (
    ("corrected", 0, "volatile", 0),
    ("corrected", 0, "aggregate", 1),
    ("uncorrected", 1, "volatile", 0),
    ("uncorrected", 1, "aggregate", 1),
)


class EccCollector:
    name = "ecc"

    def collect(self, gpu: GpuContext) -> None:
        mode = gpu.cached("nvmlDeviceGetEccMode")
        if mode is not None:
            gpu.emit(ECC_MODE, mode[0])
        for error_type, type_id, scope, counter_id in _ECC_COUNTERS:
            count = gpu.read("nvmlDeviceGetTotalEccErrors", type_id, counter_id)
            if count is not None:
                gpu.emit(ECC_ERRORS, count, error_type, scope)
        remapped = gpu.read("nvmlDeviceGetRemappedRows")
        if remapped is not None:
            correctable, uncorrectable, pending, failed = remapped
            gpu.emit(REMAPPED_ROWS, correctable, "correctable")
            gpu.emit(REMAPPED_ROWS, uncorrectable, "uncorrectable")
            gpu.emit(REMAPPED_ROWS_PENDING, pending)
            gpu.emit(REMAPPED_ROWS_FAILED, failed)


register(
    Registration(
        "ecc", "ECC error counts and row remapping", gpu=lambda config, settings, shared: [EccCollector()]
    )
)
