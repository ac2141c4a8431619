"""NVLink: active links and error totals, on GPUs that have NVLink.

The number of links is found on the first poll (link states are read until one is not supported); on a
GPU without NVLink that first read fails once and the collector costs nothing afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..nvml import GpuContext
from ..samples import gpu_counter, gpu_gauge
from .registry import Registration, register

LINKS_ACTIVE = gpu_gauge("gpu_nvlink_links_active", "NVLink links that are up.")
LINK_ERRORS = gpu_counter(
    "gpu_nvlink_errors_total",
    "NVLink errors summed over links, by type (crc_flit, crc_data, replay, recovery).",
    "type",
)

_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of the GPUs NVML supports today; the range is probed once.
# NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL
_ERROR_FIELDS = ((38, "crc_flit"), (45, "crc_data"), (52, "replay"), (59, "recovery"))


@dataclass
class LinkCount:
    """How many NVLink links a GPU has: None until probed on its first poll."""

    links: int | None = None


class NvlinkCollector:
    name = "nvlink"

    def collect(self, gpu: GpuContext) -> None:
        known = gpu.device.state(LinkCount)
        links = known.links
        active = 0
        if links is None:
            links = 0
            for link in range(_MAX_LINKS):
                state = gpu.read("nvmlDeviceGetNvLinkState", link)
                if state is None:
                    break
                links += 1
                active += state
            known.links = links
        else:
            for link in range(links):
                active += gpu.read("nvmlDeviceGetNvLinkState", link) or 0
        if not links:
            return
        gpu.emit(LINKS_ACTIVE, active)
        errors = gpu.read_fields([field_id for field_id, _ in _ERROR_FIELDS])
        for field_id, kind in _ERROR_FIELDS:
            if field_id in errors:
                gpu.emit(LINK_ERRORS, errors[field_id], kind)


register(
    Registration(
        "nvlink",
        "NVLink active links and errors, on GPUs that have NVLink",
        gpu=lambda config, settings, shared: [NvlinkCollector()],
    )
)
